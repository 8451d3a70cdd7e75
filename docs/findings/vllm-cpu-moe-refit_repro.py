"""vLLM-CPU: an in-place weight reload of an unquantized MoE model (the RL weight sync) leaves the
CPU experts un-prepacked: log-probs match neither the old nor the new weights, even when the
weights reloaded are the very ones already loaded. Prints max |dlogp| against float64
transformers. Run: VLLM_CPU_KVCACHE_SPACE=1 TORCHDYNAMO_DISABLE=1 python THIS_FILE"""

import os
import shutil
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from safetensors.torch import load_file, save_file
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32)
MOE = dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)
torch.manual_seed(0)
model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**SIZE, **HEADS, **MOE, max_position_embeddings=512))
with torch.no_grad():
    for p in model.parameters():
        p.normal_(std=0.5) if p.dim() > 1 else None  # peaked distributions, like a trained model
old_dir, new_dir = tempfile.mkdtemp(), tempfile.mkdtemp()
model.save_pretrained(old_dir)
shutil.copytree(old_dir, new_dir, dirs_exist_ok=True)
old = load_file(f"{old_dir}/model.safetensors")  # checkpoint names, as vLLM loaded them
new = {k: v + 0.05 * torch.randn_like(v) for k, v in old.items()}  # one "training step"
save_file(new, f"{new_dir}/model.safetensors", metadata={"format": "pt"})
ids = torch.randint(3, 384, (64,), generator=torch.Generator().manual_seed(1)).tolist()
target = torch.tensor(ids[1:])[:, None]


EAGER = dict(dtype=torch.float64, experts_implementation="eager")
refs = []
for path in (old_dir, new_dir):
    m = Qwen3MoeForCausalLM.from_pretrained(path, **EAGER)
    with torch.no_grad():
        lp = torch.log_softmax(m(torch.tensor([ids])).logits[0, :-1], -1)
    refs.append(lp.gather(1, target)[:, 0])
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=128, generation_config="vllm")
llm = LLM(old_dir, skip_tokenizer_init=True, **ENGINE)
params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
steps = [("at start", None), ("after reloading the SAME weights", old)]
for when, weights in [*steps, ("after reloading new weights", new)]:
    if weights is not None:
        it = iter(weights.items())
        rpc_kwargs = {"weights_iterator": it, "is_checkpoint_format": True}
        llm.collective_rpc("reload_weights", kwargs=rpc_kwargs)
        llm.reset_prefix_cache()
    out = llm.generate(TokensPrompt(prompt_token_ids=ids), params, use_tqdm=False)[0]
    pairs = zip(ids[1:], out.prompt_logprobs[1:], strict=True)
    got = torch.tensor([lp[t].logprob for t, lp in pairs], dtype=torch.float64)
    d_old, d_new = ((got - ref).abs().max() for ref in refs)
    print(f"{when:32s} max|dlogp| vs old weights {d_old:8.3g}, vs new weights {d_new:8.3g}")
