"""vLLM's GptOssForCausalLM builds every RMSNorm with eps=1e-5 whatever the config's
rms_norm_eps says. For a gpt-oss model whose config says 1e-6, prints max and mean |dlogp| of
vLLM's prompt log-probs against float64 eager transformers reading the folder as its config
says and with rms_norm_eps=1e-5 (small embeddings, so that eps shows in the norms). Needs
tiny_model_logprobs.py (the shared plumbing) next to it.
Run: VLLM_CPU_KVCACHE_SPACE=1 TORCHDYNAMO_DISABLE=1 python THIS_FILE"""

import tiny_model_logprobs as tiny  # first: it sets the environment transformers reads
import torch
from transformers import GptOssConfig, GptOssForCausalLM

SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=64)
MOE = dict(num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=4096)
config = GptOssConfig(**SIZE, **HEADS, **MOE, rms_norm_eps=1e-6)
model = tiny.random_model(GptOssForCausalLM, config, std=0.3)
with torch.no_grad():
    model.model.embed_tokens.weight.mul_(0.05)  # hidden states of variance ~2e-4 at the first norm
folder = tiny.saved(model)
ids = tiny.prompt(160, config.vocab_size)

got = tiny.vllm_prompt_logprobs(tiny.start_vllm(folder, max_model_len=256), ids)
EAGER = dict(attn_implementation="eager", experts_implementation="eager")
for eps in (1e-6, 1e-5):
    want = tiny.float64_logprobs(GptOssForCausalLM, folder, ids, rms_norm_eps=eps, **EAGER)
    d = (got - want).abs()
    print(f"float64 transformers with rms_norm_eps={eps:g}: max {d.max():.3g}, mean {d.mean():.3g}")
