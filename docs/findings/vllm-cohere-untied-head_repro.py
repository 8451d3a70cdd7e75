"""vLLM's CohereForCausalLM ignores `tie_word_embeddings: false`: logits come from the input
embedding, not from the checkpoint's lm_head. Prints max |dlogp| of vLLM against the float64
eager transformers forward of the same folder, with its own head and with the embedding as head.
Needs tiny_model_logprobs.py (the shared plumbing) next to it.
Run: VLLM_CPU_KVCACHE_SPACE=1 TORCHDYNAMO_DISABLE=1 python vllm-cohere-untied-head_repro.py"""

import tiny_model_logprobs as tiny  # first: it sets the environment transformers reads
import torch
from safetensors.torch import load_file
from transformers import CohereConfig, CohereForCausalLM

SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
config = CohereConfig(**SIZE, **HEADS, logit_scale=0.0625, tie_word_embeddings=False)
model = tiny.random_model(CohereForCausalLM, config)
with torch.no_grad():
    model.model.embed_tokens.weight.normal_(std=1.0)
    model.lm_head.weight.normal_(std=8.0)  # logits spread like a trained model's
folder = tiny.saved(model)
assert "lm_head.weight" in load_file(f"{folder}/model.safetensors")  # the head is in the file

ids = tiny.prompt(48, config.vocab_size)
ref = CohereForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager")
with torch.no_grad():
    hidden = ref.model(torch.tensor([ids])).last_hidden_state[0, :-1]
own, tied = ref.lm_head, ref.model.embed_tokens
heads = {"own lm_head (what the config says)": own, "embed_tokens as head (tied)": tied}

got = tiny.vllm_prompt_logprobs(tiny.start_vllm(folder), ids)
for name, head in heads.items():
    with torch.no_grad():
        want = tiny.next_token_logprobs(hidden @ head.weight.T * config.logit_scale, ids)
    print(f"vLLM vs float64 transformers, {name}: max |dlogp| = {(got - want).abs().max():.3g}")
