#!/usr/bin/env bash
# The one device call behind this folder (device time is 15 minutes a session, so the runs go
# side by side on the one GPU, each under `timeout`: a run cut short ends INCOMPLETE with its
# report.json, as certify does on SIGTERM). Run from the repository root; results land in $OUT.
#   big model (8 layers x 512 wide x 8,192 vocab, qwen3, docs/transfer.md's recipe):
#     default certify in fp32 and bf16 (the model's own profile, calibrated first), then the
#     ConstantBias 0.01 broken engine on rollout parity under that own bf16 profile
#   embedded model: deep certify in bf16 (shipped bf16 profile, 3 examples a property: the
#     top-size 31 x (66 + 2,048) example alone takes most of it); embedded MoE: default bf16
set -u
OUT=${OUT:?} W=${W:-/tmp/gpu} T=${T:-470}
BIG_ARGS=${BIG_ARGS:---arch qwen3 --seed 5 --vocab 8192 --layers 8 --hidden 512}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=3 PYTHONPATH=$PWD
mkdir -p "$W"
[ -n "${SKIP_INSTALL:-}" ] || python3 -m pip install -q --no-deps --no-build-isolation -e . \
    >"$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
{ python3 -c "import sys, torch, transformers, hypothesis; print(sys.version.split()[0],
  torch.__version__, transformers.__version__, hypothesis.__version__, torch.version.cuda,
  torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1; } >"$W/versions.txt"
tim() {  # tim NAME SECONDS ARGS...: one run, its log beside its report
    local name=$1 seconds=$2; shift 2
    mkdir -p "$W/$name"
    local start=$SECONDS
    timeout -s TERM "$seconds" python3 -m conformance "$@" --out "$W/$name" \
        >"$W/$name/certify.log" 2>&1
    local rc=$?
    echo "wall $((SECONDS - start)) s, exit $rc" >"$W/$name/wall.txt"
}
big="$W/models/qwen3-l8-h512-v8192"
(
    python3 -m conformance make-model "$big" $BIG_ARGS >"$W/make-model.log" 2>&1
    tim big-fp32 "$((T - 30))" certify --model "$big" &
    tim big-bf16 "$((T - 150))" certify --model "$big" --engine-dtype bfloat16
    tim big-broken-bias-bf16 "$((T - 30))" certify --model "$big" --engine-dtype bfloat16 \
        --engine tests.support.engines:ConstantBias --engine-option bias=0.01 \
        --suite rollout_parity
    wait
) &
tim deep-bf16 "$T" certify --engine-dtype bfloat16 --depth deep --profile bf16 --examples 3 &
tim moe-bf16 "$T" certify --model embedded:moe --engine-dtype bfloat16 &
wait
cp "$W/versions.txt" "$W/make-model.log" "$OUT/"
for run in "$W"/*/wall.txt; do echo "$(basename "$(dirname "$run")"): $(cat "$run")"; done \
    | tee "$OUT/walls.txt"
tail -n 3 "$W"/*/certify.log
tar czf "$OUT/runs.tgz" -C "$W" --exclude models --exclude install.log .
