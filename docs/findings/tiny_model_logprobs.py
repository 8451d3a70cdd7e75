"""The plumbing the log-prob reproducers in this folder (`*_repro.py`) share: a tiny random model
saved to a folder, a prompt of random token ids, the eager transformers forward's log-probs of
that prompt in float64 (the third computation every finding is decided by), and an engine's
prompt log-probs through its public API. Each reproducer keeps what makes it a bug report: its
model's config, what it changes, and the comparison it prints. An upstream report attaches this
file next to the reproducer; a reproducer finds it as a sibling (Python puts a script's own
folder first on sys.path), from whatever folder it is run.

Importing it sets the environment every reproducer runs under, so a reproducer imports it
before transformers (which reads HF_HUB_OFFLINE when it is imported). The engines are imported
inside the functions that start them, so that an SGLang reproducer runs in an environment
without vLLM and the other way round."""

from __future__ import annotations

import os
import tempfile
from typing import TYPE_CHECKING, Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model is a local folder: no hub look-ups
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # vLLM's engine core in-process
os.environ.setdefault("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")  # of the logits, not the sampler's
import torch
from transformers import PretrainedConfig, PreTrainedModel

if TYPE_CHECKING:
    from vllm import LLM

#: how every reproducer starts vLLM: fp32 and eager (no compiled graphs: the numbers are the
#: kernels'), token ids in and log-probs out (no tokenizer), the model folder's generation
#: defaults ignored
VLLM_ENGINE: dict[str, Any] = dict(
    dtype="float32", enforce_eager=True, skip_tokenizer_init=True, generation_config="vllm"
)
#: how every reproducer starts SGLang: its CPU engine (torch_native is the attention backend it
#: runs on CPU), fp32, token ids in and log-probs out, a small KV cache (2,048 tokens) rather
#: than one sized to the machine's memory
SGLANG_CPU_ENGINE: dict[str, Any] = dict(
    dtype="float32",
    skip_tokenizer_init=True,
    device="cpu",
    attention_backend="torch_native",
    max_total_tokens=2048,
)


def random_model(
    model_class: type[PreTrainedModel], config: PretrainedConfig, std: float | None = None
) -> PreTrainedModel:
    """``model_class(config)`` drawn from seed 0. With ``std``, every weight matrix is redrawn
    from N(0, std²): transformers' own init (std 0.02) gives near-uniform attention and logits,
    on which a soft-cap, a window or a norm's epsilon hardly shows; larger weights make them
    peaked, like a trained model's. Vectors (norm weights, biases) keep their init."""
    torch.manual_seed(0)
    model = model_class(config)
    if std is not None:
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() > 1:
                    p.normal_(std=std)
    return model


def saved(model: PreTrainedModel) -> str:
    """A new temporary folder holding ``model`` (config.json and safetensors), so that the engine
    and the float64 reference read the very same files."""
    folder = tempfile.mkdtemp()
    model.save_pretrained(folder)
    return folder


def prompt(length: int, vocab_size: int) -> list[int]:
    """``length`` token ids drawn with seed 1, from 3 up (past the ids configs give to special
    tokens), from a generator of their own so that the model's draws do not move them."""
    generator = torch.Generator().manual_seed(1)
    return torch.randint(3, vocab_size, (length,), generator=generator).tolist()


def next_token_logprobs(logits: torch.Tensor, ids: list[int]) -> torch.Tensor:
    """In float64, the log-prob that ``logits`` (one row per position but the last) give each
    next token ``ids[1:]``: the prompt log-probs an engine returns, the first token unscored."""
    target = torch.tensor(ids[1:])[:, None]
    return torch.log_softmax(logits.double(), -1).gather(1, target)[:, 0]


def transformers_logprobs(model: PreTrainedModel, ids: list[int]) -> torch.Tensor:
    """The prompt log-probs of ``model``'s own forward, in float64 whatever its dtype."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]
    return next_token_logprobs(logits, ids)


def float64_logprobs(
    model_class: type[PreTrainedModel], folder: str, ids: list[int], **load: Any
) -> torch.Tensor:
    """The prompt log-probs of the transformers forward in float64 on ``folder``; ``load`` goes
    to ``from_pretrained``: the attention or experts implementation (eager, the reference math),
    or a config field read another way than config.json says."""
    model = model_class.from_pretrained(folder, dtype=torch.float64, **load)
    return transformers_logprobs(model, ids)


def start_vllm(folder: str, max_model_len: int = 128) -> LLM:
    """vLLM's offline engine on ``folder``, started as ``VLLM_ENGINE`` says."""
    from vllm import LLM

    return LLM(folder, max_model_len=max_model_len, **VLLM_ENGINE)


def vllm_prompt_logprobs(llm: LLM, ids: list[int]) -> torch.Tensor:
    """vLLM's log-prob of each prompt token after the first (``prompt_logprobs=0``: the token's
    own, no alternatives), one token generated, in float64 for the comparison."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False)
    out = llm.generate(TokensPrompt(prompt_token_ids=ids), params, use_tqdm=False)[0]
    pairs = zip(ids[1:], out.prompt_logprobs[1:], strict=True)
    return torch.tensor([lp[t].logprob for t, lp in pairs], dtype=torch.float64)


def sglang_prompt_logprobs(folder: str, ids: list[int]) -> torch.Tensor:
    """SGLang's log-prob of each prompt token after the first, from an engine started on
    ``folder`` as ``SGLANG_CPU_ENGINE`` says and shut down once it answered (its scheduler and
    detokenizer are child processes), in float64 for the comparison."""
    import sglang

    engine = sglang.Engine(model_path=folder, **SGLANG_CPU_ENGINE)
    try:
        params = {"max_new_tokens": 1, "temperature": 0.0}
        out = engine.generate(
            input_ids=ids, sampling_params=params, return_logprob=True, logprob_start_len=0
        )
    finally:
        engine.shutdown()
    values = [lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]]
    return torch.tensor(values, dtype=torch.float64)
