"""A Gemma-2 model with attention soft-capping: vLLM against the float64 eager transformers forward,
and the installed transformers' own fp32 forward with the attention implementation it picks by
default and with SDPA (which has no soft-capping). Under transformers 5.19 the default is SDPA.
Needs tiny_model_logprobs.py (the shared plumbing) next to it.
Run: VLLM_CPU_KVCACHE_SPACE=1 TORCHDYNAMO_DISABLE=1 python THIS_FILE"""

import tiny_model_logprobs as tiny  # first: it sets the environment transformers reads
import torch
import transformers
from transformers import Gemma2Config, Gemma2ForCausalLM

SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32)
CAPS = dict(attn_logit_softcapping=2.0, final_logit_softcapping=10.0, sliding_window=64)
config = Gemma2Config(**SIZE, **HEADS, **CAPS, max_position_embeddings=512)
# std 0.5: attention scores big enough for the caps to bend them
folder = tiny.saved(tiny.random_model(Gemma2ForCausalLM, config, std=0.5))
ids = tiny.prompt(100, config.vocab_size)

ref = tiny.float64_logprobs(Gemma2ForCausalLM, folder, ids, attn_implementation="eager")
got = tiny.vllm_prompt_logprobs(tiny.start_vllm(folder), ids)
print(f"vLLM fp32 vs float64 eager: max |dlogp| = {(got - ref).abs().max():.3g}")
for attn in (None, "sdpa"):
    try:
        m = Gemma2ForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation=attn)
    except ValueError as exc:
        print(f"transformers {transformers.__version__} {attn}: refused ({str(exc)[:60]}...)")
        continue
    worst = (tiny.transformers_logprobs(m, ids) - ref).abs().max()
    used = m.config._attn_implementation
    print(f"transformers {transformers.__version__} fp32, asked {attn}, ran {used}: {worst:.3g}")
