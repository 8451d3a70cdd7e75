"""SGLang serves MistralForCausalLM as LlamaForCausalLM: the config's sliding_window is never
applied. Prints max |dlogp| of SGLang's prompt log-probs against float64 eager transformers,
inside the window and past it, reading the folder with its window and without one. Needs
tiny_model_logprobs.py (the shared plumbing) next to it.
Run (CPU): SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=tests/support/sgl_kernel_cpu python THIS_FILE
(PyPI has no CPU sgl_kernel; the stand-in provides the one kernel the CPU engine calls.)"""

import tiny_model_logprobs as tiny  # first: it sets the environment transformers reads
from transformers import MistralConfig, MistralForCausalLM

W = 64
SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=W)

if __name__ == "__main__":  # SGLang's scheduler processes import this file again
    config = MistralConfig(**SIZE, **HEADS, max_position_embeddings=512)
    model = tiny.random_model(MistralForCausalLM, config, std=0.3)  # peaked attention and logits
    folder = tiny.saved(model)
    ids = tiny.prompt(160, config.vocab_size)

    got = tiny.sglang_prompt_logprobs(folder, ids)
    for window in (W, None):
        want = tiny.float64_logprobs(MistralForCausalLM, folder, ids, sliding_window=window)
        d = (got - want).abs()
        inside, past = d[:W].max(), d[W:].max()
        print(f"float64 transformers, sliding_window={window}: positions 1-{W} {inside:.3g}, "
              f"past {past:.3g}")  # fmt: skip
