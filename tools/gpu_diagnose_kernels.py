"""Two GPU failures of docs/evidence/gpu/2026-11-26-h200/run.sh reproduced outside the suites,
to say which side is wrong (docs/evidence/gpu/2026-11-26-h200/README.md).

padding (fp32): certify's shrunk case, a 1-token prompt left-padded to 65 beside a 65-token one,
one token sampled at T = 0.7. Per row: the log-prob hf-generate reports for the token it
sampled, and that token's log-prob from the same weights' full forward of the row alone (no
padding: what the trainer computes), under each attention kernel.

determinism (bf16): certify's case (1 x 512-token prompt, seed 519, 128 tokens) generated four
times per attention kernel; where the tokens, and before them the log-probs, first differ.

    python tools/gpu_diagnose_kernels.py MODEL CASES [--deterministic]

with CASES = docs/evidence/gpu/2026-11-26-h200/cases.
"""

import json
import os
import sys
from contextlib import nullcontext
from pathlib import Path

if "--deterministic" in sys.argv:
    # must be set before cuBLAS starts
    os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from conformance.engines.base import EngineConfig, SamplingSpec
from conformance.engines.hf_generate import HFGenerateEngine

KERNELS = {
    "sdpa (default choice)": ("sdpa", None),
    "sdpa math only": ("sdpa", [SDPBackend.MATH]),
    "sdpa efficient only": ("sdpa", [SDPBackend.EFFICIENT_ATTENTION]),
    "sdpa cudnn only": ("sdpa", [SDPBackend.CUDNN_ATTENTION]),
    "sdpa flash only": ("sdpa", [SDPBackend.FLASH_ATTENTION]),
    "eager": ("eager", None),
}


def load(path: Path) -> tuple[list[list[int]], SamplingSpec]:
    case = json.loads(path.read_text())
    return case["prompt_ids"], SamplingSpec(**case["sampling"])


def engine(model: Path, dtype: str, attn: str) -> HFGenerateEngine:
    return HFGenerateEngine(
        EngineConfig(model=model, dtype=dtype, options={"attn_implementation": attn})
    )


def kernel(backends: list[SDPBackend] | None):
    return sdpa_kernel(backends) if backends else nullcontext()


def first_difference(a: list, b: list) -> int | None:
    # runs that diverge may end at different lengths: compare the common part
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)


def padding(model: Path, cases: Path) -> None:
    prompts, spec = load(cases / "padding-fp32.json")
    for label, (attn, backends) in KERNELS.items():
        eng = engine(model, "float32", attn)
        try:
            with kernel(backends):
                completions = eng.generate(prompts, spec)
                for row, (prompt, c) in enumerate(zip(prompts, completions, strict=True)):
                    ids = torch.tensor([prompt + c.tokens], device=eng._model.device)
                    with torch.no_grad():
                        logits = eng._model(ids).logits[0, len(prompt) - 1].float()
                    alone = float(logits.log_softmax(-1)[c.tokens[0]])
                    print(
                        f"padding fp32 | {label} | row {row} (prompt {len(prompt)}) | token "
                        f"{c.tokens[0]} | engine {c.logprobs[0]:.4f} | alone {alone:.4f} | "
                        f"diff {c.logprobs[0] - alone:+.4f}",
                        flush=True,
                    )
        except RuntimeError as exc:
            print(f"padding fp32 | {label} | not run: {str(exc).splitlines()[0]}", flush=True)
        del eng


def determinism(model: Path, cases: Path, deterministic: bool) -> None:
    prompts, spec = load(cases / "determinism-bf16.json")
    if deterministic:
        torch.use_deterministic_algorithms(True)
    tag = "deterministic algorithms" if deterministic else "default algorithms"
    for label, (attn, backends) in KERNELS.items():
        eng = engine(model, "bfloat16", attn)
        try:
            with kernel(backends):
                runs = [eng.generate(prompts, spec)[0] for _ in range(4)]
        except RuntimeError as exc:
            print(f"determinism bf16 | {tag} | {label} | not run: {str(exc).splitlines()[0]}")
            continue
        first = runs[0]
        for index, again in enumerate(runs[1:], start=2):
            print(
                f"determinism bf16 | {tag} | {label} | run 1 vs {index}: tokens differ from "
                f"{first_difference(first.tokens, again.tokens)}, log-probs from "
                f"{first_difference(first.logprobs, again.logprobs)} (of {len(first.tokens)})",
                flush=True,
            )
        del eng


if __name__ == "__main__":
    model, cases = Path(sys.argv[1]), Path(sys.argv[2])
    deterministic = "--deterministic" in sys.argv
    print(torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu")
    if not deterministic:
        padding(model, cases)
    determinism(model, cases, deterministic)
