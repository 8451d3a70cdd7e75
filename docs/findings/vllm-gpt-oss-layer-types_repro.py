"""vLLM's GptOssForCausalLM puts the sliding window on the even layers whatever the config's
`layer_types` says. For a model whose layer_types are [full, sliding], prints max |dlogp| of
vLLM against float64 eager transformers inside the window and past it, reading the folder as
its config says and as [sliding, full]. Needs tiny_model_logprobs.py (the shared plumbing) next
to it. Run: VLLM_CPU_KVCACHE_SPACE=1 TORCHDYNAMO_DISABLE=1 python THIS_FILE"""

import tiny_model_logprobs as tiny  # first: it sets the environment transformers reads
from transformers import GptOssConfig, GptOssForCausalLM

W = 64
SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=W)
MOE = dict(num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=4096)
YARN = dict(rope_type="yarn", factor=16.0, original_max_position_embeddings=256, truncate=False)
ROPE = dict(**YARN, beta_fast=32.0, beta_slow=1.0, rope_theta=150000.0)
config = GptOssConfig(**SIZE, **HEADS, **MOE, rope_parameters=ROPE)
config.layer_types = ["full_attention", "sliding_attention"]
model = tiny.random_model(GptOssForCausalLM, config, std=0.3)  # peaked attention and logits
folder = tiny.saved(model)
ids = tiny.prompt(160, config.vocab_size)

got = tiny.vllm_prompt_logprobs(tiny.start_vllm(folder, max_model_len=256), ids)
EAGER = dict(attn_implementation="eager", experts_implementation="eager")
for layer_types in (config.layer_types, ["sliding_attention", "full_attention"]):
    want = tiny.float64_logprobs(GptOssForCausalLM, folder, ids, layer_types=layer_types, **EAGER)
    d = (got - want).abs()
    inside, past = d[:W].max(), d[W:].max()
    print(f"float64 transformers as {layer_types}: positions 1-{W} {inside:.3g}, past {past:.3g}")
