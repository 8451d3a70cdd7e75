"""A stray `rms_norm_eps` in a Cohere config.json (transformers' Cohere ignores it) makes vLLM
normalise with RMSNorm instead of the family's LayerNorm. Prints max |dlogp| of vLLM against the
float64 eager transformers forward, for one tied Cohere model saved without and with the key.
Needs tiny_model_logprobs.py (the shared plumbing) next to it.
Run: VLLM_CPU_KVCACHE_SPACE=1 TORCHDYNAMO_DISABLE=1 python THIS_FILE"""

import json

import tiny_model_logprobs as tiny  # first: it sets the environment transformers reads
import torch
from transformers import CohereConfig, CohereForCausalLM

SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
config = CohereConfig(**SIZE, **HEADS, logit_scale=1.0)  # tied, as published
model = tiny.random_model(CohereForCausalLM, config)
with torch.no_grad():
    model.model.embed_tokens.weight.normal_(std=0.5)
ids = tiny.prompt(48, config.vocab_size)

for stray in (False, True):
    folder = tiny.saved(model)
    if stray:  # what a config written from one set of fields for every family carries
        with open(f"{folder}/config.json") as f:
            fields = {**json.load(f), "rms_norm_eps": 1e-6}
        with open(f"{folder}/config.json", "w") as f:
            json.dump(fields, f)
    want = tiny.float64_logprobs(CohereForCausalLM, folder, ids)  # same math either way
    llm = tiny.start_vllm(folder)
    worst = (tiny.vllm_prompt_logprobs(llm, ids) - want).abs().max()
    print(f"rms_norm_eps in config.json: {stray!s:5}  vLLM vs float64 transformers: {worst:.3g}")
    del llm
