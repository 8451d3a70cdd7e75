"""A stray `rms_norm_eps` in a Cohere config.json (transformers' Cohere ignores it) makes vLLM
normalise with RMSNorm instead of the family's LayerNorm. Prints max |dlogp| of vLLM against the
float64 eager transformers forward, for one tied Cohere model saved without and with the key.
Run: VLLM_CPU_KVCACHE_SPACE=1 TORCHDYNAMO_DISABLE=1 python THIS_FILE"""

import json
import os
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import CohereConfig, CohereForCausalLM
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
torch.manual_seed(0)
model = CohereForCausalLM(CohereConfig(**SIZE, **HEADS, logit_scale=1.0))  # tied, as published
with torch.no_grad():
    model.model.embed_tokens.weight.normal_(std=0.5)
ids = torch.randint(3, 384, (48,), generator=torch.Generator().manual_seed(1)).tolist()
target = torch.tensor(ids[1:])[:, None]
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=128, generation_config="vllm")
params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)

for stray in (False, True):
    folder = tempfile.mkdtemp()
    model.save_pretrained(folder)
    if stray:  # what a config written from one set of fields for every family carries
        with open(f"{folder}/config.json") as f:
            fields = {**json.load(f), "rms_norm_eps": 1e-6}
        with open(f"{folder}/config.json", "w") as f:
            json.dump(fields, f)
    ref = CohereForCausalLM.from_pretrained(folder, dtype=torch.float64)  # same math either way
    with torch.no_grad():
        want = torch.log_softmax(ref(torch.tensor([ids])).logits[0, :-1], -1).gather(1, target)
    llm = LLM(folder, skip_tokenizer_init=True, **ENGINE)
    out = llm.generate(TokensPrompt(prompt_token_ids=ids), params, use_tqdm=False)[0]
    pairs = zip(ids[1:], out.prompt_logprobs[1:], strict=True)
    got = torch.tensor([lp[t].logprob for t, lp in pairs], dtype=torch.float64)
    worst = (got - want[:, 0]).abs().max()
    print(f"rms_norm_eps in config.json: {stray!s:5}  vLLM vs float64 transformers: {worst:.3g}")
    del llm
