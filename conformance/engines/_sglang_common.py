"""What the in-process ``sglang`` engine and the ``sglang-server`` engine share: options, the
environment SGLang reads, the CPU-kernel stand-in switch, and the request/reply format of
``generate`` (the same fields offline and over ``POST /generate``).

SGLang quirks handled here:

- input logprobs start with ``None`` for the first requested position, so scoring asks from
  ``logprob_start_len=0`` and drops that entry;
- in ``input_token_logprobs`` ids >= vocab_size − 1 come back as 0: the value is right, the id
  is not, so ids are never read back from there;
- output logprobs are divided by the temperature unless ``SGLANG_RETURN_ORIGINAL_LOGPROB=1``;
- on CPU the rope cos/sin cache is cast to the model dtype unless ``SGLANG_ROPE_CACHE_FP32=1``
  (on CUDA SGLang always keeps it fp32); the harness keeps it fp32 by default, as on GPU.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from conformance.component_options import parse_bool, parse_engine_options, parse_positive_int
from conformance.engines import _sglang_internals as internals
from conformance.engines.base import (
    Completion,
    EngineCapabilities,
    EngineConfig,
    Knob,
    LogprobKind,
    Request,
    SamplingSpec,
    TokenBatch,
)
from conformance.env import SGL_KERNEL_STANDIN
from conformance.errors import EngineUnavailable, UsageError
from conformance.parallel import ParallelSetting
from conformance.releases import ReleaseRange
from conformance.sampling import SamplerOrder

log = logging.getLogger("conformance.engines.sglang")


def _int(value: str) -> int:
    return int(value)


#: engine option → parser of its string value (as ``--tim-engine-option KEY=VALUE`` gives it)
OPTIONS: dict[str, Callable[[str], Any]] = {
    "device": str,
    "attention_backend": str,
    "max_total_tokens": parse_positive_int,
    "disable_radix_cache": parse_bool,
    "chunked_prefill_size": _int,
    "max_running_requests": parse_positive_int,
    # SGLang's admission estimate of a new request's tokens to come (an environment variable)
    "clip_max_new_tokens_estimation": parse_positive_int,
    "context_length": parse_positive_int,
    "rope_cache_fp32": parse_bool,
    # SGLang honours a request's sampling_seed only in deterministic-inference mode
    "enable_deterministic_inference": parse_bool,
    "tp_size": parse_positive_int,
    # load the model's tokenizer (off: token ids in and out, nothing detokenized); stop strings
    # need it
    "tokenizer": parse_bool,
    # the scheduler blocks on its sockets between requests instead of polling them
    "sleep_on_idle": parse_bool,
}

#: measured on its CPU engine here (docs/engine-versions.md): 0.5.22 and 0.5.23 certify; 0.5.21 and
#: older pin another torch, transformers and sglang-kernel, and were not tried
RELEASES = ReleaseRange("sglang", min="0.5.22", max_tested="0.5.23")

#: the engines' parallel setting (see ``conformance.parallel``)
PARALLEL = ParallelSetting(option="tp_size", label="tp_size")
#: the option bounding the KV cache, already in tokens (``EngineCapabilities.kv_budget_option``)
KV_BUDGET_OPTION = "max_total_tokens"
#: the environment variable SGLang reads its admission estimate from (``kv_budget_requires``
#: below), and the user's own value
CLIP_ESTIMATION = "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION"
_USER_CLIP = os.environ.get(CLIP_ESTIMATION)

#: what both adapters declare
CAPABILITIES = EngineCapabilities(
    # what the knob suite varies (``conformance.knobs``: two variant engines hold these values)
    knobs={
        "disable_radix_cache": Knob(("false", "true")),
        "chunked_prefill_size": Knob(("16", "64")),
        "max_running_requests": Knob(("1", "4")),
    },
    parallel=PARALLEL,
    releases=RELEASES,
    # the radix (prefix) cache on: SGLang's default
    prefix_cache={"disable_radix_cache": "false"},
    # stop strings need the text, so the tokenizer
    stop_strings={"tokenizer": "true"},
    # measured (docs/moe-engines.md); the adapters do not ask
    no_routes="SGLang-CPU 0.5.23 cannot return routed experts: enable_return_routed_experts "
    "fails at start (its routes buffer is CUDA-pinned host memory: 'Found no NVIDIA driver')",
    parallel_sampling=True,
    # SGLang keeps top-p's nucleus of the whole sorted distribution and intersects it with the
    # top k (its torch sampler cuts at the cumulative sum of all probabilities, its FlashInfer
    # path asks for ``filter_apply_order="joint"``): its support is that, not the stated
    # sampler's. Measured on its CPU engine: 169 of 2,048 tokens at T 1.3, top-k 20, top-p 0.9
    # lay outside the stated support, none outside the joint one's
    sampler_order=SamplerOrder.JOINT,
    min_p=True,
    kv_budget_option=KV_BUDGET_OPTION,
    # SGLang admits the requests that arrive together while their prompts and their whole
    # ``max_new_tokens`` (clipped at ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``, 4096) fit the
    # free cache, and admits no more until one finishes (``PrefillAdder``, 0.5.23): one batch
    # sent at once never outgrows its cache, and SGLang never retracts. Estimating 16 tokens to
    # come, it admits as a busy server does, whose running requests are charged a decayed
    # fraction of theirs, and retracts (measured: 3 retractions on the preemption suite's batch)
    kv_budget_requires={"clip_max_new_tokens_estimation": "16"},
    mixed_requests=True,
)

#: options the harness reads itself rather than passing to SGLang
_OWN_OPTIONS = frozenset({"rope_cache_fp32", "tokenizer", "clip_max_new_tokens_estimation"})


def _defaults() -> dict[str, Any]:
    import torch

    cpu = not torch.cuda.is_available()
    return {
        "device": "cpu" if cpu else "cuda",
        # no AMX on small CPUs; on CUDA SGLang picks its own backend
        "attention_backend": "torch_native" if cpu else None,
        # without a bound the CPU KV cache takes ~14 GB
        "max_total_tokens": 2048,
        "rope_cache_fp32": True,
        # an idle scheduler polls its sockets at 100 % of a core (measured, 0.5.23 CPU engine:
        # 100.6 % against 5.6 % sleeping, the same log-probs): on a CPU machine that core is the
        # one the backend, the engine's own compute and the other engines the harness starts
        # need; on CUDA SGLang's default stays
        "sleep_on_idle": True if cpu else None,
    }


def parse_options(
    engine: str, options: Mapping[str, Any], *, extra: Mapping[str, Callable[[str], Any]]
) -> dict[str, Any]:
    """Typed options without defaults (``with_defaults`` adds them)."""
    parsed = parse_engine_options(engine, options, {**OPTIONS, **extra}, {})
    _check_tensor_parallel(parsed)
    return parsed


def with_defaults(options: Mapping[str, Any]) -> dict[str, Any]:
    return {**_defaults(), **options}


def _check_tensor_parallel(options: Mapping[str, Any]) -> None:
    """sglang 0.5.23 builds every tensor-parallel group with a NCCL communicator unless the
    platform is NPU/XPU (``parallel_state.init_model_parallel_group``): on CPU that fails
    ("Expected a cuda device, but got: cpu"), and the failing scheduler then SIGQUITs the process
    that started it. So tp_size > 1 on CPU is refused up front."""
    merged = with_defaults(options)
    if merged["device"] == "cpu" and PARALLEL.size(merged) > 1:
        raise UsageError(
            f"SGLang's CPU engine cannot run tp_size={PARALLEL.size(merged)}: its "
            "tensor-parallel groups need NCCL (a CUDA device)",
            "use tp_size=1 on CPU, or run SGLang on GPUs",
        )


def server_args(config: EngineConfig, options: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``sglang.Engine`` (``launch_server`` takes the same as flags)."""
    args = {
        "model_path": str(config.model),
        "dtype": config.dtype,
        "random_seed": config.seed,
        # token ids in, token ids out: nothing is detokenized unless stop strings need the text
        "skip_tokenizer_init": not options.get("tokenizer", False),
        "log_level": "warning",
        **{k: v for k, v in options.items() if k in OPTIONS and k not in _OWN_OPTIONS},
    }
    return {k: v for k, v in args.items() if v is not None}


def environment(config: EngineConfig, options: Mapping[str, Any]) -> dict[str, str]:
    """Environment variables SGLang reads when its scheduler starts."""
    return {
        "SGLANG_USE_CPU_ENGINE": "1" if options["device"] == "cpu" else "0",
        "SGLANG_RETURN_ORIGINAL_LOGPROB": "1" if config.logprobs is LogprobKind.RAW else "0",
        "SGLANG_ROPE_CACHE_FP32": "1" if options["rope_cache_fp32"] else "0",
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        **clip_estimation(options),
    }


def clip_estimation(options: Mapping[str, Any]) -> dict[str, str]:
    """``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`` as the option sets it, else as the user had it
    when the harness started (a variant's value must not outlive it in this process's
    environment, which later engines inherit: :func:`apply_environment`), else nothing."""
    value = options.get("clip_max_new_tokens_estimation") or _USER_CLIP
    return {CLIP_ESTIMATION: str(value)} if value is not None else {}


def apply_environment(env: Mapping[str, str]) -> None:
    """Set ``env`` in this process's environment, which SGLang's scheduler inherits, dropping
    an admission estimate an earlier variant set that ``env`` does not."""
    if CLIP_ESTIMATION not in env:
        os.environ.pop(CLIP_ESTIMATION, None)
    os.environ.update(env)


def sglang_version() -> str | None:
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def knobs(options: Mapping[str, Any]) -> dict[str, Any]:
    """The options as SGLang is asked to run: each SGLang takes (:data:`OPTIONS`, but the
    harness's own) at the value given, else at SGLang's own default
    (:func:`~conformance.engines._sglang_internals.server_arg_defaults`), so that a launch
    spelling out a default is the stack that left it unspelt; the harness's own as given."""
    defaults = internals.server_arg_defaults()
    asked = {k: defaults[k] for k in OPTIONS if k not in _OWN_OPTIONS and k in defaults}
    # None: the harness leaves the option to SGLang (its CUDA defaults)
    return {**asked, **{k: v for k, v in options.items() if v is not None}}


def describe(
    options: Mapping[str, Any], env: Mapping[str, str], standin: str | None
) -> dict[str, Any]:
    """The SGLang part of an engine's ``info()``."""
    return {
        "sglang": sglang_version(),
        "knobs": knobs(options),
        "env": dict(env),
        "sgl_kernel_standin": standin,
        # SGLang applies sampling_seed only in deterministic-inference mode
        "seeded": bool(options.get("enable_deterministic_inference")),
    }


def _real_kernels_import() -> bool:
    try:
        module = importlib.import_module("sgl_kernel")
    except (ImportError, OSError):
        # a half-imported CUDA build must not shadow the stand-in
        for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
            del sys.modules[name]
        return False
    return not getattr(module, "IS_STANDIN", False)


def kernel_standin(device: str) -> str | None:
    """The stand-in folder to put first on the path, or ``None`` when the real kernels import.

    SGLang's CPU engine imports a few CPU kernels of ``sgl_kernel``, of which PyPI has no CPU
    build; ``TIM_SGL_KERNEL_STANDIN`` (set by ``tox -e sglang``) names a pure-torch stand-in.
    """
    if device != "cpu" or _real_kernels_import():
        return None
    folder = SGL_KERNEL_STANDIN.get()
    if not folder:
        raise EngineUnavailable(
            "sgl_kernel does not import here, and SGLang's CPU engine needs its CPU kernels",
            "install an sgl_kernel build for this machine, or set "
            f"{SGL_KERNEL_STANDIN.name} to a folder holding a stand-in (tox -e sglang does)",
        )
    if not os.path.isfile(os.path.join(folder, "sgl_kernel", "__init__.py")):
        raise UsageError(
            f"{SGL_KERNEL_STANDIN.name}={folder} holds no sgl_kernel package",
            "point it at its parent folder",
        )
    return folder


def activate_standin(folder: str) -> None:
    """Put the stand-in first on this process's path (spawned schedulers inherit it); once."""
    if folder in sys.path:
        return
    sys.path.insert(0, folder)
    log.warning("sgl_kernel stand-in active (CPU test support): %s", folder)


def sampling_params(spec: SamplingSpec, *, tokenizer: bool) -> dict[str, Any]:
    """SGLang's sampling fields for ``spec``.

    SGLang keeps the token that ended a rollout (EOS, a ``stop_token_ids`` entry, or the one
    completing a ``stop`` string) in ``output_token_logprobs``; ``no_stop_trim`` keeps it in
    ``output_ids`` and the text too, where the detokenizing path would trim it. Stop strings
    need the text: without the ``tokenizer`` option the engine runs on token ids alone
    (``skip_tokenizer_init``), and a spec with them is refused as a missing feature.
    """
    if spec.stop and not tokenizer:
        raise NotImplementedError(
            "SGLang runs on token ids alone unless started with engine option tokenizer=true: "
            "stop strings need the tokenizer"
        )
    return {
        "max_new_tokens": spec.max_new_tokens,
        "temperature": spec.temperature,
        "top_p": spec.top_p,
        # SGLang spells "off" as -1
        "top_k": spec.top_k or -1,
        "min_p": spec.min_p,
        "ignore_eos": spec.ignore_eos,
        "stop_token_ids": list(spec.stop_token_ids),
        **({"stop": list(spec.stop)} if spec.stop else {}),
        "no_stop_trim": True,
        # one seed per request: a prompt's rollout does not depend on its batch-mates
        "sampling_seed": spec.seed,
        # n samples per prompt: SGLang caches the prompt's prefill once, then sends n
        # requests of it, its replies prompt-major (prompt i's n at i·n + j)
        **({"n": spec.n} if spec.n > 1 else {}),
    }


def generate_request(
    prompts: TokenBatch, spec: SamplingSpec, top_logprobs: int, options: Mapping[str, Any]
) -> dict[str, Any]:
    """Fields of ``Engine.generate`` and of the body of ``POST /generate``."""
    check_nonempty(prompts)
    return {
        "input_ids": [list(p) for p in prompts],
        "sampling_params": sampling_params(spec, tokenizer=bool(options.get("tokenizer"))),
        "return_logprob": True,
        "top_logprobs_num": top_logprobs,
    }


def generate(
    prompts: TokenBatch,
    spec: SamplingSpec,
    top_logprobs: int,
    options: Mapping[str, Any],
    send: Callable[[dict[str, Any]], list[dict[str, Any]]],
) -> list[Completion]:
    """``Engine.generate`` of both engines: the request goes out through ``send`` (the offline
    engine's call, or ``POST /generate``) and its replies are read alike, so the two engines
    sample the same way and differ only in transport."""
    replies = send(generate_request(prompts, spec, top_logprobs, options))
    return completions(prompts, replies, top_logprobs, spec.n)


def score_request(sequences: TokenBatch) -> dict[str, Any]:
    """A prefill-only request returning input logprobs from position 0 on."""
    check_nonempty(sequences)
    return {
        "input_ids": [list(s) for s in sequences],
        "sampling_params": {"max_new_tokens": 0},
        "return_logprob": True,
        "logprob_start_len": 0,
    }


def check_nonempty(sequences: TokenBatch) -> None:
    if not sequences or any(len(s) < 1 for s in sequences):
        raise UsageError("an empty batch or token sequence was given", "give >= 1 token each")


def accepted(reply: Mapping[str, Any]) -> Mapping[str, Any]:
    """The reply, unless SGLang aborted the request (too long, bad values): then a UsageError."""
    finish = reply["meta_info"].get("finish_reason")
    if isinstance(finish, Mapping) and finish.get("type") == "abort":
        raise UsageError(
            f"SGLang rejected a request: {finish.get('message', finish)}",
            "use shorter sequences or valid sampling values, or raise context_length",
        )
    return reply


def completions(
    prompts: TokenBatch, replies: Sequence[Mapping[str, Any]], top_logprobs: int, n: int = 1
) -> list[Completion]:
    """``Completion`` per child from SGLang's replies (``n`` per prompt, prompt-major)."""
    children = [prompt for prompt in prompts for _ in range(n)]
    return [
        completion(prompt, reply, top_logprobs)
        for prompt, reply in zip(children, replies, strict=True)
    ]


def completion(prompt: Sequence[int], reply: Mapping[str, Any], top_logprobs: int) -> Completion:
    """``Completion`` from one SGLang reply, with ``top_logprobs`` top entries per token."""
    meta = accepted(reply)["meta_info"]
    entries = meta["output_token_logprobs"]
    tokens = [int(entry[1]) for entry in entries]
    if list(reply.get("output_ids", tokens)) != tokens:
        raise ValueError("SGLang's output ids and output logprob ids disagree")
    top = None
    if top_logprobs:
        top = [
            {int(e[1]): float(e[0]) for e in ranked[:top_logprobs]}
            for ranked in meta["output_top_logprobs"]
        ]
    finish = meta.get("finish_reason") or {}
    return Completion(
        prompt=list(prompt),
        tokens=tokens,
        logprobs=[float(entry[0]) for entry in entries],
        top_logprobs=top,
        finish_reason=finish.get("type", "length") if isinstance(finish, dict) else "length",
    )


def mixed_request(requests: Sequence[Request], options: Mapping[str, Any]) -> dict[str, Any]:
    """Fields of ``Engine.generate`` for a mixed batch: per-request lists of sampling params
    and top-logprob counts (:func:`generate_request`'s fields, one per request)."""
    fields = [generate_request([r.prompt], r.spec, r.top_logprobs, options) for r in requests]
    return {
        "input_ids": [f["input_ids"][0] for f in fields],
        "sampling_params": [f["sampling_params"] for f in fields],
        "return_logprob": True,
        "top_logprobs_num": [f["top_logprobs_num"] for f in fields],
    }


class Retractions:
    """How many times SGLang retracted the requests whose replies it was shown (freed their KV
    cache when it ran out, to recompute them later): the sum of the replies'
    ``meta_info["num_retractions"]`` (0.5.22–0.5.23), or None once a reply lacked it. Replies
    may come from several threads (a server's requests in flight)."""

    def __init__(self) -> None:
        self.count: int | None = 0
        self._lock = threading.Lock()

    def add(self, replies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """``replies``, their retractions counted."""
        counts = [reply.get("meta_info", {}).get("num_retractions") for reply in replies]
        with self._lock:
            if self.count is not None:
                missing = any(c is None for c in counts)
                self.count = None if missing else self.count + int(sum(counts))
        return replies


def scores(sequences: TokenBatch, replies: Sequence[Mapping[str, Any]]) -> list[list[float]]:
    """n − 1 logprobs per sequence from ``input_token_logprobs`` (from position 0).

    Entry 0 is ``None`` (no prefix); the ids beside the values are not read, since SGLang
    reports ids >= vocab_size − 1 as 0 there.
    """
    result = []
    for seq, reply in zip(sequences, replies, strict=True):
        entries = accepted(reply)["meta_info"]["input_token_logprobs"]
        if len(entries) != len(seq) or entries[0][0] is not None:
            raise ValueError(f"SGLang returned {len(entries)} input logprobs for {len(seq)} tokens")
        result.append([float(entry[0]) for entry in entries[1:]])
    return result
