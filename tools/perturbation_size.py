"""How big a weight-sync perturbation a trained model survives, and whether a stale engine
still stands out from bf16 drift at that size.

The weight-sync suite pushes ``perturbed(weights, seed)`` into the engine: every tensor moved
by ``s·σ(w)·ε``. For each scale ``s`` this measures, on chat prompts with the base model's
greedy answers (the tokens an RL step scores):

- ``stale``: |log p_perturbed − log p_base| per answer token, fp32: what an engine that kept
  its old weights (or its old cached keys and values) shows against a trainer holding the
  new ones;
- ``half_refit``: the same for an engine that took only the first half of the tensors (in
  sorted order), a refit that stops early;
- ``drift``: |log p_bf16 − log p_fp32| of the perturbed model: what a sound bf16 engine shows
  against an fp32 trainer, which the sync suite's calibrated bounds must hold;
- ``top1``: the perturbed model's mean top-token probability (the base model's at ``s = 0``):
  whether it is still peaked like the trained model;
- the perturbed model's greedy answer to one question (random ids for a model without a chat
  template).

Run from the repository root: ``PYTHONPATH=. python tools/perturbation_size.py MODEL``; one
JSON object per scale on stdout.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from conformance.chat_prompts import rendered_prompts
from conformance.hf_model import load_causal_lm
from conformance.weights import perturbed, read_weights

SCALES = (0.0, 0.01, 0.03, 0.05, 0.07, 0.1, 0.3, 0.5)
ANSWER_TOKENS = 48
QUESTION = "What is the capital of France?"


def answer_logprobs(model: torch.nn.Module, rows: list[list[int]], starts: list[int]):
    """Per answer token: log p of the token taken, and the top token's probability."""
    lps, tops = [], []
    for row, start in zip(rows, starts, strict=True):
        ids = torch.tensor([row])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), dim=-1)
        taken = logp.gather(-1, ids[0, 1:, None])[:, 0]
        lps.append(taken[start - 1 :])
        tops.append(logp[start - 1 :].exp().max(-1).values)
    return torch.cat(lps), torch.cat(tops)


def greedy(model: torch.nn.Module, prompt: list[int], tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False, top_p=None
        )
    return out[0].tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--prompts", type=int, default=8)
    args = parser.parse_args()

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if tokenizer.chat_template is None:
        # a random-initialised model: random ids are what the suites draw for it
        generator = torch.Generator().manual_seed(0)
        vocab = len(tokenizer)
        prompts = [torch.randint(vocab, (64,), generator=generator).tolist() for _ in range(8)]
        question = prompts[0]
    else:
        prompts = [list(p) for p in rendered_prompts(tokenizer)[: args.prompts]]
        question = list(rendered_prompts(tokenizer, corpus=(QUESTION,), system_prompts=())[0])
    base = load_causal_lm(args.model, "float32", "sdpa")
    rows = [greedy(base, p, ANSWER_TOKENS) for p in prompts]
    starts = [len(p) for p in prompts]
    base_lp, _ = answer_logprobs(base, rows, starts)
    original = read_weights(args.model)
    lm_bf16 = load_causal_lm(args.model, "bfloat16", "sdpa")

    for scale in SCALES:
        new = perturbed(original, seed=1, scale=scale) if scale else original
        base.load_state_dict(new)
        lm_bf16.load_state_dict({k: v.to(torch.bfloat16) for k, v in new.items()})
        lp, top1 = answer_logprobs(base, rows, starts)
        lp_bf16, _ = answer_logprobs(lm_bf16, rows, starts)
        answer = greedy(base, question, 16)[len(question) :]
        # a refit that stops half-way (tests/support's PartialRefit)
        half = sorted(new)[: len(new) // 2]
        base.load_state_dict({**original, **{n: new[n] for n in half}})
        lp_half, _ = answer_logprobs(base, rows, starts)
        stale = (lp - base_lp).abs()
        drift = (lp_bf16 - lp).abs()
        print(
            json.dumps(
                {
                    "scale": scale,
                    "tokens": len(lp),
                    "stale_mean": round(stale.mean().item(), 5),
                    "stale_max": round(stale.max().item(), 4),
                    "half_refit_mean": round((lp_half - base_lp).abs().mean().item(), 5),
                    "half_refit_max": round((lp_half - base_lp).abs().max().item(), 4),
                    "drift_bf16_mean": round(drift.mean().item(), 5),
                    "drift_bf16_max": round(drift.max().item(), 4),
                    "top1_mean": round(top1.mean().item(), 4),
                    "answer": tokenizer.decode(answer),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
