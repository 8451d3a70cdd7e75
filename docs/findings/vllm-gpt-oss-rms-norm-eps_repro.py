"""vLLM's GptOssForCausalLM builds every RMSNorm with eps=1e-5 whatever the config's
rms_norm_eps says. For a gpt-oss model whose config says 1e-6, prints max and mean |dlogp| of
vLLM's prompt log-probs against float64 eager transformers reading the folder as its config
says and with rms_norm_eps=1e-5 (small embeddings, so that eps shows in the norms).
Run: VLLM_CPU_KVCACHE_SPACE=1 TORCHDYNAMO_DISABLE=1 python THIS_FILE"""

import os
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import GptOssConfig, GptOssForCausalLM
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=64)
MOE = dict(num_local_experts=4, num_experts_per_tok=2, max_position_embeddings=4096)
config = GptOssConfig(**SIZE, **HEADS, **MOE, rms_norm_eps=1e-6)
torch.manual_seed(0)
model = GptOssForCausalLM(config)
with torch.no_grad():
    for p in model.parameters():
        p.normal_(std=0.3) if p.dim() > 1 else None
    model.model.embed_tokens.weight.mul_(0.05)  # hidden states of variance ~2e-4 at the first norm
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
for eps in (1e-6, 1e-5):
    ref = GptOssForCausalLM.from_pretrained(folder, rms_norm_eps=eps, **EAGER)
    with torch.no_grad():
        want = torch.log_softmax(ref(torch.tensor([ids])).logits[0, :-1], -1).gather(1, target)
    d = (got - want[:, 0]).abs()
    print(f"float64 transformers with rms_norm_eps={eps:g}: max {d.max():.3g}, mean {d.mean():.3g}")
