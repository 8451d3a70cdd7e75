"""vLLM's GptOssForCausalLM puts the sliding window on the even layers whatever the config's
`layer_types` says. For a model whose layer_types are [full, sliding], prints max |dlogp| of
vLLM against float64 eager transformers inside the window and past it, reading the folder as
its config says and as [sliding, full].
Run: VLLM_CPU_KVCACHE_SPACE=1 TORCHDYNAMO_DISABLE=1 python THIS_FILE"""

import os
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import GptOssConfig, GptOssForCausalLM
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

W = 64
SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=W)
MOE = dict(num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=4096)
YARN = dict(rope_type="yarn", factor=16.0, original_max_position_embeddings=256, truncate=False)
ROPE = dict(**YARN, beta_fast=32.0, beta_slow=1.0, rope_theta=150000.0)
config = GptOssConfig(**SIZE, **HEADS, **MOE, rope_parameters=ROPE)
config.layer_types = ["full_attention", "sliding_attention"]
torch.manual_seed(0)
model = GptOssForCausalLM(config)
with torch.no_grad():
    for p in model.parameters():
        p.normal_(std=0.3) if p.dim() > 1 else None  # peaked attention and logits
folder = tempfile.mkdtemp()
model.save_pretrained(folder)
ids = torch.randint(3, 384, (160,), generator=torch.Generator().manual_seed(1)).tolist()
target = torch.tensor(ids[1:])[:, None]

ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=256, generation_config="vllm")
llm = LLM(folder, skip_tokenizer_init=True, **ENGINE)
params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
out = llm.generate(TokensPrompt(prompt_token_ids=ids), params, use_tqdm=False)[0]
pairs = zip(ids[1:], out.prompt_logprobs[1:], strict=True)
got = torch.tensor([lp[t].logprob for t, lp in pairs], dtype=torch.float64)
EAGER = dict(dtype=torch.float64, attn_implementation="eager", experts_implementation="eager")
for layer_types in (config.layer_types, ["sliding_attention", "full_attention"]):
    ref = GptOssForCausalLM.from_pretrained(folder, layer_types=layer_types, **EAGER)
    with torch.no_grad():
        want = torch.log_softmax(ref(torch.tensor([ids])).logits[0, :-1], -1).gather(1, target)
    d = (got - want[:, 0]).abs()
    inside, past = d[:W].max(), d[W:].max()
    print(f"float64 transformers as {layer_types}: positions 1-{W} {inside:.3g}, past {past:.3g}")
