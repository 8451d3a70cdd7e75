"""vLLM's CohereForCausalLM ignores `tie_word_embeddings: false`: logits come from the input
embedding, not from the checkpoint's lm_head. Prints max |dlogp| of vLLM against the float64
eager transformers forward of the same folder, with its own head and with the embedding as head.
Run: VLLM_CPU_KVCACHE_SPACE=1 TORCHDYNAMO_DISABLE=1 python vllm-cohere-untied-head_repro.py"""

import os
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from safetensors.torch import load_file
from transformers import CohereConfig, CohereForCausalLM
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=512)
config = CohereConfig(**SIZE, **HEADS, logit_scale=0.0625, tie_word_embeddings=False)
torch.manual_seed(0)
model = CohereForCausalLM(config)
with torch.no_grad():
    model.model.embed_tokens.weight.normal_(std=1.0)
    model.lm_head.weight.normal_(std=8.0)  # logits spread like a trained model's
folder = tempfile.mkdtemp()
model.save_pretrained(folder)
assert "lm_head.weight" in load_file(f"{folder}/model.safetensors")  # the head is in the file

ids = torch.randint(3, 384, (48,), generator=torch.Generator().manual_seed(1)).tolist()
target = torch.tensor(ids[1:])[:, None]
ref = CohereForCausalLM.from_pretrained(folder, dtype=torch.float64, attn_implementation="eager")
with torch.no_grad():
    hidden = ref.model(torch.tensor([ids])).last_hidden_state[0, :-1]
own, tied = ref.lm_head, ref.model.embed_tokens
heads = {"own lm_head (what the config says)": own, "embed_tokens as head (tied)": tied}

ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=128, generation_config="vllm")
llm = LLM(folder, skip_tokenizer_init=True, **ENGINE)
params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
out = llm.generate(TokensPrompt(prompt_token_ids=ids), params, use_tqdm=False)[0]
pairs = zip(ids[1:], out.prompt_logprobs[1:], strict=True)
got = torch.tensor([lp[t].logprob for t, lp in pairs], dtype=torch.float64)
for name, head in heads.items():
    with torch.no_grad():
        logits = hidden @ head.weight.T * config.logit_scale
    want = torch.log_softmax(logits, -1).gather(1, target)[:, 0]
    print(f"vLLM vs float64 transformers, {name}: max |dlogp| = {(got - want).abs().max():.3g}")
