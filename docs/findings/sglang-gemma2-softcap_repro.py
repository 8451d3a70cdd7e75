"""SGLang's Gemma-2 on its CPU engine against float64 eager transformers: prints max |dlogp|
of SGLang's prompt log-probs inside the sliding window and past it, reading the folder as its
config says and with each of its soft-caps and its window taken out, to show which one SGLang's
numbers follow.
Run (CPU): SGLANG_USE_CPU_ENGINE=1 PYTHONPATH=tests/support/sgl_kernel_cpu python THIS_FILE
(PyPI has no CPU sgl_kernel; the stand-in provides the one kernel the CPU engine calls.)"""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
import sglang
import torch
from transformers import Gemma2Config, Gemma2ForCausalLM

W = 64
SIZE = dict(vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
HEADS = dict(num_attention_heads=2, num_key_value_heads=1, head_dim=32, sliding_window=W)
CAPS = dict(final_logit_softcapping=10.0, attn_logit_softcapping=2.0, query_pre_attn_scalar=32)
CPU = dict(device="cpu", attention_backend="torch_native", max_total_tokens=2048)
READINGS = {
    "as config.json says": {},
    "attn_logit_softcapping=None": {"attn_logit_softcapping": None},
    "final_logit_softcapping=None": {"final_logit_softcapping": None},
    "no window": {"sliding_window": 4096},
}

if __name__ == "__main__":
    torch.manual_seed(0)
    config = Gemma2Config(**SIZE, **HEADS, **CAPS, max_position_embeddings=512)
    config.hidden_act = "gelu_pytorch_tanh"  # the hub's configs carry it; SGLang reads it
    model = Gemma2ForCausalLM(config)
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
    for reading, change in READINGS.items():
        ref = Gemma2ForCausalLM.from_pretrained(
            folder, dtype=torch.float64, attn_implementation="eager", **change
        )
        with torch.no_grad():
            want = torch.log_softmax(ref(torch.tensor([ids])).logits[0, :-1], -1).gather(1, target)
        d = (got.double() - want[:, 0]).abs()
        print(f"float64 transformers, {reading}: positions 1-{W} max {d[:W].max():.3g}, "
              f"past {d[W:].max():.3g}; position 1 {d[0]:.3g}")  # fmt: skip
