"""How far two fp32 implementations of one model are from exact, and from each other.

Scores the same sequences (four chat prompts with their greedy answers, four random-id ones)
in one prefill with transformers in fp32 and fp64 and, where vLLM is installed, with the
``vllm`` engine in fp32, eager and compiled (``enforce_eager=false``), and prints per sequence
the largest |Δ log p| of each against fp64 and against transformers' fp32, and the mean signed
Δ against fp64. An fp32 engine that is as close to fp64 as transformers' fp32
is rounding differently, not computing something else; docs/smollm2.md holds the numbers.

    PYTHONPATH=. python tools/fp64_distance.py MODEL_DIR

Runs in a few minutes on SmolLM2-135M (two CPU cores).
"""

from __future__ import annotations

import argparse
import importlib.util
from pathlib import Path

import torch

QUESTIONS = (
    "What is the capital of France?",
    "Write a haiku about rain.",
    "Explain gradient descent briefly.",
    "List three prime numbers.",
)
#: random-id sequences: how many, how long
RANDOM_SEQUENCES, RANDOM_LEN = 4, 72
ANSWER_TOKENS = 40


def sequences(model: Path, lm: torch.nn.Module) -> list[list[int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    out = []
    for question in QUESTIONS:
        chat = [{"role": "user", "content": question}]
        ids = tokenizer.apply_chat_template(chat, add_generation_prompt=True)
        ids = ids["input_ids"] if hasattr(ids, "keys") else ids
        answer = lm.generate(torch.tensor([ids]), max_new_tokens=ANSWER_TOKENS, do_sample=False)
        out.append(answer[0].tolist())
    generator = torch.Generator().manual_seed(0)
    vocab = lm.config.vocab_size
    for _ in range(RANDOM_SEQUENCES):
        out.append(torch.randint(3, vocab, (RANDOM_LEN,), generator=generator).tolist())
    return out


def scored(lm: torch.nn.Module, sequence: list[int]) -> torch.Tensor:
    """log p of each token after the first, from one forward pass, in float64."""
    with torch.no_grad():
        logp = lm(torch.tensor([sequence])).logits[0].double().log_softmax(-1)
    return logp[:-1].gather(-1, torch.tensor(sequence[1:])[:, None])[:, 0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    model = parser.parse_args().model
    from transformers import AutoModelForCausalLM

    fp32 = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    fp64 = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64).eval()
    seqs = sequences(model, fp32)
    engines: dict[str, list[list[float]]] = {}
    if importlib.util.find_spec("vllm") is not None:
        from conformance.engines.base import EngineConfig
        from conformance.engines.vllm import VLLMEngine

        for name, eager in (("vllm-eager", "true"), ("vllm-compiled", "false")):
            config = EngineConfig(model=model, dtype="float32", options={"enforce_eager": eager})
            with VLLMEngine(config) as engine:
                engines[name] = engine.score(seqs)
    for index, sequence in enumerate(seqs):
        hf32, exact = scored(fp32, sequence), scored(fp64, sequence)
        kind = "chat" if index < len(QUESTIONS) else "random"
        line = f"{kind:6} hf32: vs fp64 {_distance(hf32, exact)}"
        for name, scores in engines.items():
            engine = torch.tensor(scores[index], dtype=torch.float64)
            line += f" | {name}: vs fp64 {_distance(engine, exact)}, "
            line += f"vs hf32 max {(engine - hf32).abs().max():.2e}"
        print(line, flush=True)


def _distance(lp: torch.Tensor, exact: torch.Tensor) -> str:
    return f"max {(lp - exact).abs().max():.2e} mean {(lp - exact).mean():+.1e}"


if __name__ == "__main__":
    main()
