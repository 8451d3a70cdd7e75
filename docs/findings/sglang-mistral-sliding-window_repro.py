"""SGLang serves MistralForCausalLM as LlamaForCausalLM: the config's sliding_window is never
applied. Prints max |dlogp| of SGLang's prompt log-probs against float64 eager transformers,
inside the window and past it, reading the folder with its window and without one.
Run (CPU): SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=tests/support/sgl_kernel_cpu python THIS_FILE
(PyPI has no CPU sgl_kernel; the stand-in provides the one kernel the CPU engine calls.)"""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
import sglang
import torch
from transformers import MistralConfig, MistralForCausalLM

W = 64
SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=W)
CPU = dict(device="cpu", attention_backend="torch_native", max_total_tokens=2048)

if __name__ == "__main__":
    torch.manual_seed(0)
    model = MistralForCausalLM(MistralConfig(**SIZE, **HEADS, max_position_embeddings=512))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(std=0.3) if p.dim() > 1 else None  # peaked attention and logits
    folder = tempfile.mkdtemp()
    model.save_pretrained(folder)
    ids = torch.randint(3, 384, (160,), generator=torch.Generator().manual_seed(1)).tolist()
    target = torch.tensor(ids[1:])[:, None]

    engine = sglang.Engine(model_path=folder, dtype="float32", skip_tokenizer_init=True, **CPU)
    params = {"max_new_tokens": 1, "temperature": 0.0}
    out = engine.generate(input_ids=ids, sampling_params=params, return_logprob=True,
                          logprob_start_len=0)  # fmt: skip
    got = torch.tensor([lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]])
    engine.shutdown()
    for window in (W, None):
        ref = MistralForCausalLM.from_pretrained(folder, sliding_window=window, dtype=torch.float64)
        with torch.no_grad():
            want = torch.log_softmax(ref(torch.tensor([ids])).logits[0, :-1], -1).gather(1, target)
        d = (got.double() - want[:, 0]).abs()
        inside, past = d[:W].max(), d[W:].max()
        print(f"float64 transformers, sliding_window={window}: positions 1-{W} {inside:.3g}, "
              f"past {past:.3g}")  # fmt: skip
