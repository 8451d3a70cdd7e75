"""Where one-row decode and a full forward part in fp32: the hidden state at one position.

Runs a sequence through transformers in fp32 twice, as a whole (what a trainer recomputes) and
by KV-cache decode of its last tokens one at a time (what an engine serves), and prints, at
each decoded position, how far the next-token log-probabilities of the two are apart (median
and max over the vocabulary, and at the token that follows), and at the worst position, layer
by layer, the hidden state's norm, its largest coordinate and how far the two paths put it
apart. A position whose hidden state holds a massive activation (one coordinate in the
thousands) is where the two fp32 paths part by orders of magnitude more than elsewhere: the
model's conditioning, not a kernel's defect, when eager attention reads the same as sdpa.

    PYTHONPATH=. python tools/decode_conditioning.py MODEL_DIR [--attn eager]

The default sequence is the one a sound fp32 SmolLM2-135M stack was shrunk to in
``logprob_semantics`` (511 copies of id 0, a newline, then three sampled tokens);
docs/profiles.md holds its numbers. Runs in about a minute on two CPU cores.
"""

from __future__ import annotations

import argparse

import torch

#: 511 copies of id 0, a newline (198), then the three tokens sampled after it at T = 1.3
DEFAULT_SEQUENCE = (0,) * 511 + (198, 29, 198, 39708)
#: how many of the last positions are decoded one at a time
DECODED = 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--attn", default="sdpa", choices=("sdpa", "eager"))
    parser.add_argument("--ids", type=int, nargs="+", default=list(DEFAULT_SEQUENCE))
    args = parser.parse_args()
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=torch.float32, attn_implementation=args.attn
    ).eval()
    ids = torch.tensor([args.ids])
    first = ids.shape[1] - DECODED
    with torch.no_grad():
        whole = model(ids, output_hidden_states=True)
        out = model(ids[:, :first], use_cache=True)
        cache, decoded = out.past_key_values, []
        for t in range(first, ids.shape[1]):
            out = model(ids[:, t : t + 1], past_key_values=cache, output_hidden_states=True)
            cache = out.past_key_values
            decoded.append(out)
    full_lp = whole.logits[0].double().log_softmax(-1)
    worst, worst_median = first, -1.0
    print(f"attention {args.attn}; position: median and max |Δ log p| over the vocabulary")
    for step, t in enumerate(range(first, ids.shape[1])):
        delta = (full_lp[t] - decoded[step].logits[0, -1].double().log_softmax(-1)).abs()
        following = f", next token {delta[args.ids[t + 1]]:.2e}" if t + 1 < len(args.ids) else ""
        print(f"  {t}: median {delta.median():.2e}, max {delta.max():.2e}{following}")
        if delta.median() > worst_median:
            worst, worst_median = t, float(delta.median())
    print(f"position {worst}, layer by layer: |h|, max |h_i|, max |Δh_i| (relative |Δh|/|h|)")
    step = worst - first
    pairs = zip(whole.hidden_states, decoded[step].hidden_states, strict=True)
    for layer, (a, b) in enumerate(pairs):
        h, diff = a[0, worst], a[0, worst] - b[0, -1]
        print(
            f"  {layer:2d}: {h.norm():8.1f} {h.abs().max():8.1f} "
            f"{diff.abs().max():.2e} ({diff.norm() / h.norm():.1e})"
        )


if __name__ == "__main__":
    main()
