"""The MoE weight-sync failure of docs/evidence/gpu/2026-11-26-h200/run.sh replayed outside the
suite (here on CPU: the device time was spent): which rows are off, and whether a row scores the
same alone as in its batch. Per step — original weights, after the sync to perturbation seed 2,
after restoring — each row's summed |Δ log-prob| between hf-generate's scoring (bf16) and the hf
backend (fp32) holding the same weights, and the batched row's Σ log ρ/√len; rows under 0.5 nats
are left out, except the longest.

    python tools/gpu_diagnose_moe_sync.py CASE

with CASE = docs/evidence/gpu/2026-11-26-h200/cases/weight-sync-moe-bf16.json.
"""

import json
import sys
import tempfile
from pathlib import Path

from conformance.backends.base import BackendConfig
from conformance.backends.hf import HFBackend
from conformance.engines.base import EngineConfig
from conformance.engines.hf_generate import HFGenerateEngine
from conformance.models.cache import model_folder
from conformance.weights import perturbed, read_weights, write_model


def deltas(got: list[float], want: list[float]) -> tuple[float, float]:
    """Σ|Δ log-prob| and Σ log ρ/√len (the metric the suite bounds,
    seq_log_ratio_per_sqrt_len_max) between the engine's ``got`` and the backend's ``want``."""
    signed = [w - g for g, w in zip(got, want, strict=True)]
    return sum(map(abs, signed)), sum(signed) / len(signed) ** 0.5


def rows(label: str, engine: HFGenerateEngine, model: Path, sequences: list[list[int]]) -> None:
    scored = engine.score(sequences)
    expected = HFBackend(BackendConfig(model=model)).recompute(sequences).logprobs
    longest = max(range(len(sequences)), key=lambda r: len(sequences[r]))
    for row, (got, want) in enumerate(zip(scored, expected, strict=True)):
        diff, per_sqrt_len = deltas(got, want.tolist())
        if diff > 0.5 or row == longest:
            # scored alone only where printed: one engine call per row otherwise
            alone_diff, _ = deltas(engine.score([sequences[row]])[0], want.tolist())
            print(
                f"moe weight sync | {label} | row {row} ({len(sequences[row])} tokens) | "
                f"batched Σ|Δ| {diff:.3f} | alone Σ|Δ| {alone_diff:.3f} | "
                f"Σ log ρ/√len {per_sqrt_len:+.2f}",
                flush=True,
            )


if __name__ == "__main__":
    sequences = json.loads(Path(sys.argv[1]).read_text())["prompt_ids"]
    model = model_folder("embedded:moe")
    engine = HFGenerateEngine(EngineConfig(model=model, dtype="bfloat16"))
    original = read_weights(model)
    new = perturbed(original, 2)
    with tempfile.TemporaryDirectory() as scratch:
        synced = write_model(new, model, Path(scratch))
        rows("original weights", engine, model, sequences)
        engine.load_weights(new)
        rows("synced to seed 2", engine, synced, sequences)
        engine.load_weights(original)
        rows("restored", engine, model, sequences)
