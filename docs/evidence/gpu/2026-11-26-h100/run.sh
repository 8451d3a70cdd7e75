#!/usr/bin/env bash
# The one device call behind this folder: the last 268 s of this task's device time, so three
# certifies of the 8 x 512 x 8,192 qwen3 model run side by side on the one GPU (the H200 runs
# showed side-by-side certifies barely slow each other), each under `timeout`: a run cut short
# ends INCOMPLETE with its report.json, as certify does on SIGTERM. Each writes into $OUT as it
# goes, so whatever finished comes back even if the call itself is cut.
#   bf16 and fp16 engine with eager attention (the H200's bf16 failure was cuDNN SDPA rerunning
#   differently; eager reran bitwise there), and fp16 under the default SDPA choice;
#   each judged by the model's own profile, calibrated on this GPU first (certify's default).
set -u
OUT=${OUT:?} T=${T:-170}
BIG_ARGS=${BIG_ARGS:---arch qwen3 --seed 5 --vocab 8192 --layers 8 --hidden 512}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 PYTHONPATH=$PWD
W=${W:-/tmp/gpu}; mkdir -p "$W"
[ -n "${SKIP_INSTALL:-}" ] || python3 -m pip install -q --no-deps --no-build-isolation -e . \
    >"$W/install.log" 2>&1 || { cat "$W/install.log"; exit 1; }
{ python3 -c "import sys, torch, transformers, hypothesis; print(sys.version.split()[0],
  torch.__version__, transformers.__version__, hypothesis.__version__, torch.version.cuda,
  torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu')"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1; } >"$OUT/versions.txt"
tim() {  # tim NAME ARGS...: one certify, its log and wall time beside its report
    local name=$1; shift
    mkdir -p "$OUT/$name"
    local start=$SECONDS
    timeout -s TERM "$T" python3 -m conformance certify "$@" --out "$OUT/$name" \
        >"$OUT/$name/certify.log" 2>&1
    local rc=$?
    echo "$name: wall $((SECONDS - start)) s, exit $rc" | tee "$OUT/$name/wall.txt"
}
big="$W/models/qwen3-l8-h512-v8192"
python3 -m conformance make-model "$big" $BIG_ARGS >"$OUT/make-model.log" 2>&1 || exit 1
tim big-bf16-eager --model "$big" --engine-dtype bfloat16 --engine-option attn_implementation=eager &
tim big-fp16-eager --model "$big" --engine-dtype float16 --engine-option attn_implementation=eager &
tim big-fp16 --model "$big" --engine-dtype float16 &
wait
tail -n 4 "$OUT"/*/certify.log
