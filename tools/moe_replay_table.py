"""The routing-replay table of docs/moe.md: on the embedded MoE model, hf-generate (bf16)
against the hf backend (fp32, bf16) without replay, replaying the engine's expert ids, and its
ids and combine weights; 32 prompts x (512 + 128) tokens, sampling seeds 0-2, mean (min-max)
over the seeds.

    python tools/moe_replay_table.py
"""

import statistics

import torch

from conformance.backends import BackendConfig
from conformance.backends.hf import HFBackend
from conformance.engines import EngineConfig, SamplingSpec
from conformance.engines.hf_generate import HFGenerateEngine
from conformance.models import model_folder
from conformance.routing import REPLAY_MODES, routing_metrics
from conformance.suite_support import generated_routes, generated_rows

PROMPTS, LENGTH, NEW, SEEDS = 32, 512, 128, (0, 1, 2)
COLUMNS = {
    "route_agreement": "route agreement",
    "route_flip_tokens": "tokens with a flip",
    "mean": "mean |Δlp|",
    "abs_diff_mean_route_kept": "mean |Δlp| routed alike",
    "abs_diff_mean_route_flipped": "mean |Δlp| flipped",
    "max": "max |Δlp|",
}


def measured(backend: HFBackend, completions: list) -> dict[str, float]:
    sequences = [c.sequence for c in completions]
    out = backend.recompute(sequences, routes=[c.routes for c in completions])
    train, infer, _ = generated_rows(completions, out.logprobs)
    diffs = [
        (torch.tensor(t, dtype=torch.float64) - torch.tensor(i, dtype=torch.float64)).abs()
        for t, i in zip(train, infer, strict=True)
    ]
    metrics = routing_metrics(*generated_routes(completions, out.routes), diffs)
    every = torch.cat(diffs)
    return {**metrics, "mean": float(every.mean()), "max": float(every.max())}


def cell(runs: list[dict[str, float]], key: str) -> str:
    values = [r[key] for r in runs if key in r]
    if not values:
        return "—"
    return f"{statistics.mean(values):.4g} ({min(values):.4g}–{max(values):.4g})"


def main() -> None:
    model = model_folder("embedded:moe")
    print(f"| engine vs backend | replay | {' | '.join(COLUMNS.values())} |")
    print(f"|---|---|{'---|' * len(COLUMNS)}")
    for backend_dtype in ("float32", "bfloat16"):
        engine = HFGenerateEngine(EngineConfig(model=model, dtype="bfloat16"))
        batches = []
        for seed in SEEDS:
            generator = torch.Generator().manual_seed(seed)
            prompts = torch.randint(3, 384, (PROMPTS, LENGTH), generator=generator).tolist()
            batches.append(engine.generate(prompts, SamplingSpec(max_new_tokens=NEW, seed=seed)))
        for mode in REPLAY_MODES:
            options = {"routing_replay": mode}
            backend = HFBackend(BackendConfig(model=model, dtype=backend_dtype, options=options))
            runs = [measured(backend, completions) for completions in batches]
            cells = " | ".join(cell(runs, key) for key in COLUMNS)
            print(f"| bf16 vs {backend_dtype} | {mode} | {cells} |")


if __name__ == "__main__":
    main()
