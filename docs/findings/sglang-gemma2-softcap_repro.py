"""SGLang's Gemma-2 on its CPU engine against float64 eager transformers: prints max |dlogp|
of SGLang's prompt log-probs inside the sliding window and past it, reading the folder as its
config says and with each of its soft-caps and its window taken out, to show which one SGLang's
numbers follow. Needs tiny_model_logprobs.py (the shared plumbing) next to it.
Run (CPU): SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=tests/support/sgl_kernel_cpu python THIS_FILE
(PyPI has no CPU sgl_kernel; the stand-in provides the one kernel the CPU engine calls.)"""

import tiny_model_logprobs as tiny  # first: it sets the environment transformers reads
from transformers import Gemma2Config, Gemma2ForCausalLM

W = 64
SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=W)
CAPS = dict(final_logit_softcapping=10.0, attn_logit_softcapping=2.0, query_pre_attn_scalar=32)
READINGS = {
    "as config.json says": {},
    "attn_logit_softcapping=None": {"attn_logit_softcapping": None},
    "final_logit_softcapping=None": {"final_logit_softcapping": None},
    "no window": {"sliding_window": 4096},
}

if __name__ == "__main__":  # SGLang's scheduler processes import this file again
    config = Gemma2Config(**SIZE, **HEADS, **CAPS, max_position_embeddings=512)
    config.hidden_act = "gelu_pytorch_tanh"  # the hub's configs carry it; SGLang reads it
    model = tiny.random_model(Gemma2ForCausalLM, config, std=0.3)  # peaked attention and logits
    folder = tiny.saved(model)
    ids = tiny.prompt(160, config.vocab_size)

    got = tiny.sglang_prompt_logprobs(folder, ids)
    for reading, change in READINGS.items():
        load = dict(attn_implementation="eager", **change)
        d = (got - tiny.float64_logprobs(Gemma2ForCausalLM, folder, ids, **load)).abs()
        print(f"float64 transformers, {reading}: positions 1-{W} max {d[:W].max():.3g}, "
              f"past {d[W:].max():.3g}; position 1 {d[0]:.3g}")  # fmt: skip
