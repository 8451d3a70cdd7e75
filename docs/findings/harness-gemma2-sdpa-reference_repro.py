"""A Gemma-2 model with attention soft-capping: vLLM against the float64 eager transformers forward,
and the installed transformers' own fp32 forward with the attention implementation it picks by
default and with SDPA (which has no soft-capping). Under transformers 5.19 the default is SDPA.
Run: VLLM_CPU_KVCACHE_SPACE=1 TORCHDYNAMO_DISABLE=1 python THIS_FILE"""

import os
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
import transformers
from transformers import Gemma2Config, Gemma2ForCausalLM
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32)
CAPS = dict(attn_logit_softcapping=2.0, final_logit_softcapping=10.0, sliding_window=64)
torch.manual_seed(0)
model = Gemma2ForCausalLM(Gemma2Config(**SIZE, **HEADS, **CAPS, max_position_embeddings=512))
with torch.no_grad():
    for p in model.parameters():
        p.normal_(std=0.5) if p.dim() > 1 else None  # scores big enough for the caps to bend them
folder = tempfile.mkdtemp()
model.save_pretrained(folder)
ids = torch.randint(3, 384, (100,), generator=torch.Generator().manual_seed(1)).tolist()
target = torch.tensor(ids[1:])[:, None]


def transformers_logprobs(dtype, attn):
    m = Gemma2ForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=attn)
    with torch.no_grad():
        lp = torch.log_softmax(m(torch.tensor([ids])).logits[0, :-1].double(), -1)
    return lp.gather(1, target)[:, 0], m.config._attn_implementation


ref, _ = transformers_logprobs(torch.float64, "eager")
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=128, generation_config="vllm")
llm = LLM(folder, skip_tokenizer_init=True, **ENGINE)
params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
out = llm.generate(TokensPrompt(prompt_token_ids=ids), params, use_tqdm=False)[0]
pairs = zip(ids[1:], out.prompt_logprobs[1:], strict=True)
got = torch.tensor([lp[t].logprob for t, lp in pairs], dtype=torch.float64)
print(f"vLLM fp32 vs float64 eager: max |dlogp| = {(got - ref).abs().max():.3g}")
for attn in (None, "sdpa"):
    try:
        lp, used = transformers_logprobs(torch.float32, attn)
    except ValueError as exc:
        print(f"transformers {transformers.__version__} {attn}: refused ({str(exc)[:60]}...)")
        continue
    worst = (lp - ref).abs().max()
    print(f"transformers {transformers.__version__} fp32, asked {attn}, ran {used}: {worst:.3g}")
