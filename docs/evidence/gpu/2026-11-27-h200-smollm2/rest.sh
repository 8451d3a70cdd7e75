#!/usr/bin/env bash
# The second device call behind docs/evidence/gpu/2026-11-27-h200-smollm2/, on the machine the
# first (docs/evidence/gpu/2026-11-27-h200-smollm2/run.sh) left warm: for each of its two certifies cut
# by the call's deadline, certify again the suites it had not finished (any check not pass, fail
# or skip), under the own profile that run cached, with the same options.
set -u
OUT=${OUT:?} W=${W:-/tmp/gpu} T=${T:-215}
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=4 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TIM_CONFORMANCE_CACHE=$W/cache PYTHONPATH=/tmp/site:$PWD
rest() {  # rest RUN: --suite NAME for each suite RUN left unfinished
    python3 -c "
import json, pathlib
r = json.load(open('$W/runs/$1/report.json'))
done = {c['suite'] for c in r['checks'] if c['status'] in ('pass', 'fail', 'skip')}
cut = {c['suite'] for c in r['checks'] if c['status'] not in ('pass', 'fail', 'skip')}
names = sorted(p.stem[5:] for p in pathlib.Path('suites').glob('test_*.py'))
print(' '.join('--suite ' + s for s in names if s not in done or s in cut))"
}
for run in smol-bf16-hf smol-bf16-fsdp; do
    chosen=$(rest $run); echo "$run: $chosen"
    backend=""; [ $run = smol-bf16-fsdp ] && backend="--backend fsdp --backend-option world_size=1"
    mkdir -p "$W/runs/$run-rest"
    (t0=$SECONDS
     # shellcheck disable=SC2086  # the options are words
     timeout -s TERM "$T" python3 -m conformance certify --model "$W/models/smollm2" \
         --engine-dtype bfloat16 --engine-option attn_implementation=eager --examples 5 \
         $backend $chosen --out "$W/runs/$run-rest" >"$W/runs/$run-rest/certify.log" 2>&1
     echo "$run-rest: wall $((SECONDS - t0)) s, exit $?" | tee "$W/runs/$run-rest/wall.txt") &
done
wait
tail -n 3 "$W"/runs/*-rest/certify.log
tar czf "$OUT/rest.tgz" -C "$W/runs" smol-bf16-hf-rest smol-bf16-fsdp-rest
