#!/usr/bin/env bash
# The device call behind docs/evidence/gpu/2026-11-26-h200/diagnose.log: the model
# docs/evidence/gpu/2026-11-26-h200/run.sh certified, built again, then tools/gpu_diagnose_kernels.py.
set -u
OUT=${OUT:?} W=${W:-/tmp/gpu}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
cases=docs/evidence/gpu/2026-11-26-h200/cases
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || exit 1
python3 -m conformance make-model "$W/qwen3-l8-h512-v8192" --arch qwen3 --seed 5 --vocab 8192 \
    --layers 8 --hidden 512 >/dev/null 2>&1
python3 -c "import sys; from pathlib import Path; from conformance.models.info import folder_digest; print('model', folder_digest(Path(sys.argv[1])))" "$W/qwen3-l8-h512-v8192" | tee "$OUT/diagnose.log"
python3 tools/gpu_diagnose_kernels.py "$W/qwen3-l8-h512-v8192" "$cases" 2>&1 | tee -a "$OUT/diagnose.log"
python3 tools/gpu_diagnose_kernels.py "$W/qwen3-l8-h512-v8192" "$cases" --deterministic 2>&1 \
    | grep -v "^[0-9]" | tee -a "$OUT/diagnose.log"
