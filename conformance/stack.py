"""The stack under test: the resolved options, how to build its engine and backend, and its
fingerprint (what a certificate pins down)."""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance import options, releases
from conformance.backends import BackendConfig
from conformance.depth import Depth, depth, forward_weights
from conformance.dtypes import canonical_dtype, implied_profile
from conformance.engines import EngineConfig, LogprobKind
from conformance.errors import UsageError
from conformance.host import device_info, package_versions
from conformance.options import (
    ATTN_CHOICES,
    MAX_BATCH_TOKENS,
    RUN_SHAPE_OPTIONS,
    parse_key_values,
)

if TYPE_CHECKING:
    from conformance.models import ModelInfo

#: environment variables that change numerics (or which kernels run), recorded in fingerprints
NUMERICS_ENV_PREFIXES = (
    "VLLM_",
    "SGLANG_",
    "TORCH",
    "PYTORCH_",
    "CUBLAS_",
    "CUDNN_",
    "NVIDIA_TF32",
    "OMP_NUM_THREADS",
    "MKL_",
    "ONEDNN_",
    "DNNL_",
    "FLASH_ATTENTION",
    # which CPU kernels ATen dispatches to, OpenMP's and OpenBLAS's threads, NCCL's reduction
    # algorithm, SGLang's kernel switches and Triton's fp32 dot precision
    "ATEN_CPU_CAPABILITY",
    "KMP_",
    "OPENBLAS_NUM_THREADS",
    "NCCL_ALGO",
    "NCCL_PROTO",
    "SGL_",
    "TRITON_F32_DEFAULT",
)
#: endings of those variables that only say where a cache lives: torch sets
#: TORCHINDUCTOR_CACHE_DIR itself, to a folder named after the user, once inductor loads
_CACHE_LOCATIONS = ("_CACHE_DIR", "_CACHE_ROOT")
#: engine- and backend-info fields that differ between two runs of the same stack (a server's
#: port and pid, the rank processes' pids)
VOLATILE_INFO = frozenset({"url", "port", "pid", "pids"})
_DEFAULT_LOGPROBS = LogprobKind(options.LOGPROBS.default)


@dataclass(frozen=True)
class StackSpec:
    """Everything that defines a run, resolved and validated."""

    # each default is its option's (conformance.options), converted
    engine: str = options.ENGINE.default
    backend: str = options.BACKEND.default
    model: Path | None = None
    engine_dtype: str = options.ENGINE_DTYPE.default
    backend_dtype: str = options.BACKEND_DTYPE.default
    profile: str = implied_profile(options.ENGINE_DTYPE.default, options.BACKEND_DTYPE.default)
    #: whether the user named the profile; an implied one that was measured on another model or
    #: device gives way to the model's own (``preflight``)
    profile_named: bool = True
    examples: int = int(options.EXAMPLES.default)
    depth: Depth = field(default_factory=lambda: depth(options.DEPTH.default))
    #: seconds Hypothesis may spend shrinking a failure
    shrink_seconds: float = float(options.SHRINK_SECONDS.default)
    logprobs: LogprobKind = _DEFAULT_LOGPROBS
    engine_options: dict[str, str] = field(default_factory=dict)
    backend_micro_batch: int = int(options.BACKEND_MICRO_BATCH.default)
    backend_attn: str = options.BACKEND_ATTN.default
    backend_options: dict[str, str] = field(default_factory=dict)
    #: seconds one engine or backend call may take before the run ends incomplete (hung)
    call_timeout: float = float(options.CALL_TIMEOUT.default)
    #: seconds an engine or backend may take to start
    start_timeout: float = float(options.START_TIMEOUT.default)

    @classmethod
    def from_options(cls, values: dict[str, Any]) -> StackSpec:
        """Build from :func:`conformance.options.resolve` output."""
        engine_dtype = canonical_dtype(values["engine-dtype"])
        backend_dtype = canonical_dtype(values["backend-dtype"])
        options = parse_key_values(values["engine-option"])
        if values["engine-url"]:
            options["url"] = _server_url(values["engine-url"])
        try:
            logprobs = LogprobKind(values["logprobs"])
        except ValueError:
            raise UsageError(
                f"unknown logprobs kind {values['logprobs']!r}", "use raw or processed"
            ) from None
        from conformance.models import declared_experts, model_folder

        model = model_folder(values["model"]) if values["model"] else None
        moe = model is not None and declared_experts(model) > 0
        return cls(
            engine=values["engine"],
            backend=values["backend"],
            model=model,
            engine_dtype=engine_dtype,
            backend_dtype=backend_dtype,
            profile=values["profile"] or implied_profile(engine_dtype, backend_dtype, moe=moe),
            profile_named=bool(values["profile"]),
            examples=_positive_int("examples", values["examples"]),
            depth=depth(values["depth"]).with_run_shape(
                **{
                    option.name.replace("-", "_"): _positive_int(option.name, values[option.name])
                    for option in RUN_SHAPE_OPTIONS
                    if values[option.name] not in (None, "")
                }
            ),
            shrink_seconds=_positive_number("shrink-seconds", values["shrink-seconds"]),
            logprobs=logprobs,
            engine_options=options,
            backend_micro_batch=_positive_int("backend-micro-batch", values["backend-micro-batch"]),
            backend_attn=_one_of("backend-attn", values["backend-attn"], ATTN_CHOICES),
            backend_options=parse_key_values(values["backend-option"], what="backend option"),
            call_timeout=_positive_number("call-timeout", values["call-timeout"]),
            start_timeout=_positive_number("start-timeout", values["start-timeout"]),
        )

    def preflight(self) -> StackSpec:
        """Fail fast, before anything starts, on what the user can fix: the profile, the engine
        and backend (installed, options they take, releases they support), the model folder.
        Then the stack to run: where the profile was calibrated on another model or device, a
        named one stays (a one-line warning says so) and an implied one gives way to the
        model's own (:func:`conformance.profiles.own.own_profile`: calibrated once, cached)."""
        from conformance.backends import BACKENDS
        from conformance.engines import ENGINES
        from conformance.models import inspect_model
        from conformance.profiles import load_profile

        profile = load_profile(self.profile)
        engine, backend = ENGINES.get(self.engine), BACKENDS.get(self.backend)
        engine.check_options(self.engine_options)
        backend.check_options(self.backend_options)
        model = inspect_model(self.model_dir())
        self._check_run_shape(model.max_position_embeddings)
        # one line for both, once every input passed, before the model is built or anything
        # starts
        releases.warn(
            releases.check_stack(
                {
                    f"engine {self.engine!r}": engine.capabilities.releases,
                    f"backend {self.backend!r}": backend.RELEASES,
                }
            )
        )
        device = device_info()
        spec = self.within_cost(model, device)
        if spec.depth != self.depth:
            # once per process, as the warnings are: the plugin and certify both preflight
            releases.warn(f"drawing at depth {spec.depth.describe()}")
        foreign = profile.foreign_to(model.sha256, device)
        if foreign and not self.profile_named:
            from conformance.profiles.own import own_profile

            own = own_profile(
                model,
                spec.engine_dtype,
                spec.backend_dtype,
                spec.depth.name,
                cap=spec._calibration_cap(model.max_position_embeddings),
                max_tokens=spec.depth.max_batch_tokens if spec.depth.budget != "depth" else None,
            )
            return replace(spec, profile=str(own), profile_named=True)
        releases.warn(foreign)
        return spec

    def within_cost(self, model: ModelInfo, device: dict[str, Any]) -> StackSpec:
        """On a CPU, the stack with its batches' token budget sized to the model's cost
        (:meth:`conformance.depth.Depth.within_cost`): an accelerator holds the depth's own."""
        if device.get("kind") != "cpu":
            return self
        weights = forward_weights(
            hidden_size=model.hidden_size, num_layers=model.num_layers, vocab_size=model.vocab_size
        )
        return replace(self, depth=self.depth.within_cost(weights, model.max_position_embeddings))

    def _check_run_shape(self, context: int | None) -> None:
        """A run shape the model cannot hold is an error, not a silently shorter run (a depth's
        own limits are clamped to the model's context instead)."""
        shape = self.depth
        if context is None or shape.max_prompt_len is None or shape == depth(shape.name):
            return
        # one more position: an engine scores a sequence by generating one token after it
        needed = shape.max_prompt_len + shape.max_new_tokens + 1
        if needed > context:
            raise UsageError(
                f"--max-prompt-len {shape.max_prompt_len} + --max-new-tokens "
                f"{shape.max_new_tokens} (+1) needs {needed} positions; the model has {context}",
                f"pass a shorter run shape, at most {context - 1} tokens together",
            )

    def _calibration_cap(self, context: int | None) -> tuple[int, int, int] | None:
        """A run shape given in place of the depth's limits caps what its own profile is
        calibrated on (prompts, prompt length, new tokens); None for the depth's own."""
        shape, base = self.depth, depth(self.depth.name)
        unbounded = context or 1 << 30
        cap = (shape.max_batch, shape.max_prompt_len or unbounded, shape.max_new_tokens)
        limits = (base.max_batch, base.max_prompt_len or unbounded, base.max_new_tokens)
        # a shape at or above the depth's calibrates as the depth does, and shares its cache
        return cap if any(c < limit for c, limit in zip(cap, limits, strict=True)) else None

    def model_dir(self) -> Path:
        if self.model is not None:
            return self.model
        from conformance.models import default_model

        return default_model()

    def engine_config(self, model: Path, **option_changes: str) -> EngineConfig:
        return EngineConfig(
            model=model,
            dtype=self.engine_dtype,
            logprobs=self.logprobs,
            options={**self.engine_options, **option_changes},
        )

    def backend_config(self, model: Path, **changes: Any) -> BackendConfig:
        """The stack's backend config with ``changes``; ``options`` among them are added to the
        stack's backend options."""
        config = BackendConfig(
            model=model,
            dtype=self.backend_dtype,
            micro_batch_size=self.backend_micro_batch,
            attn_implementation=self.backend_attn,
            options={**self.backend_options, **changes.pop("options", {})},
        )
        return replace(config, **changes)

    def option_values(self) -> dict[str, str | list[str] | None]:
        """Each stack option's value as the command line spells it: the inverse of
        :meth:`from_options` (an ``--engine-url`` is among the engine options)."""
        return {
            "engine": self.engine,
            "backend": self.backend,
            "model": str(self.model) if self.model is not None else None,
            "engine-dtype": self.engine_dtype,
            "backend-dtype": self.backend_dtype,
            "profile": self.profile,
            "examples": str(self.examples),
            "depth": self.depth.name,
            **self._run_shape_values(),
            "shrink-seconds": f"{self.shrink_seconds:g}",
            "logprobs": self.logprobs.value,
            "engine-option": [f"{k}={v}" for k, v in sorted(self.engine_options.items())],
            "engine-url": None,
            "backend-micro-batch": str(self.backend_micro_batch),
            "backend-attn": self.backend_attn,
            "backend-option": [f"{k}={v}" for k, v in sorted(self.backend_options.items())],
            "call-timeout": f"{self.call_timeout:g}",
            "start-timeout": f"{self.start_timeout:g}",
        }

    def _run_shape_values(self) -> dict[str, str | None]:
        """The run-shape options where they replaced the depth's limits."""
        base = depth(self.depth.name)
        values: dict[str, str | None] = {}
        for option in (o for o in RUN_SHAPE_OPTIONS if o is not MAX_BATCH_TOKENS):
            field_name = option.name.replace("-", "_")
            value = getattr(self.depth, field_name)
            values[option.name] = None if value == getattr(base, field_name) else str(value)
        # the budget an option or the model's cost set, whatever its value: a replay would size
        # it to the model's cost again; the one a run shape raised, the other options raise
        given = self.depth.budget in ("option", "model cost")
        values[MAX_BATCH_TOKENS.name] = str(self.depth.max_batch_tokens) if given else None
        return values

    def pytest_args(self) -> list[str]:
        """The ``--tim-*`` flags that reproduce this stack, for people and records (replay
        commands, a certificate's stack): the stack itself reaches the plugin as this object.
        Options at their default are left out but the ones that name the stack."""
        args = []
        values = self.option_values()
        for option in options.STACK_OPTIONS:
            value = values[option.name]
            for one in value if isinstance(value, list) else [value]:
                if one is not None and (option.name in _NAMED or one != option.default):
                    args += [f"--tim-{option.name}", one]
        return args


#: the options every rendering of a stack names, default or not
_NAMED = frozenset({"engine", "backend", "engine-dtype", "backend-dtype", "profile", "examples"})


def _positive_int(name: str, value: Any) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1:
        raise UsageError(f"--{name} {value!r} is not a positive integer", f"pass e.g. --{name} 10")
    return number


def _positive_number(name: str, value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = 0.0
    if not (number > 0 and math.isfinite(number)):
        raise UsageError(f"--{name} {value!r} is not a positive number", f"pass e.g. --{name} 600")
    return number


def _one_of(name: str, value: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise UsageError(
            f"--{name} {value!r} is not one of its choices", f"use {', '.join(choices)}"
        )
    return value


def _server_url(value: str) -> str:
    """An ``--engine-url``: http(s)://HOST[:PORT][/PATH], where a server answers."""
    parts = urllib.parse.urlsplit(value)
    try:
        parts.port  # noqa: B018 — reading it is what checks it
    except ValueError:
        parts = parts._replace(netloc="")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UsageError(
            f"--engine-url {value!r} is not an http(s) URL",
            "pass e.g. --engine-url http://localhost:8000",
        )
    return value


def numerics_env() -> dict[str, str]:
    return {
        k: v
        for k, v in sorted(os.environ.items())
        if k.startswith(NUMERICS_ENV_PREFIXES) and not k.endswith(_CACHE_LOCATIONS)
    }


def parallelism(engine_info: dict[str, Any], backend_info: dict[str, Any]) -> dict[str, Any]:
    """How the stack splits its models, from each component's ``parallel`` info: the size of its
    declared parallel setting under its label (the engine's ``tp_size``, the backend's
    ``world_size``) and, for a sharded backend, its process group and mixed-precision policy. A
    component that declares no parallel setting runs in one piece and adds nothing."""
    return {**engine_info.get("parallel", {}), **backend_info.get("parallel", {})}


def fingerprint(
    spec: StackSpec,
    model_info: Any,
    engine_info: dict[str, Any],
    backend_info: dict[str, Any],
) -> dict[str, Any]:
    """The stack as recorded in report.json; ``fingerprint`` hashes all of it but the path."""
    stack = {
        "engine": spec.engine,
        "backend": spec.backend,
        "engine_dtype": spec.engine_dtype,
        "backend_dtype": spec.backend_dtype,
        "logprobs": spec.logprobs.value,
        "model": {
            "path": str(model_info.path),
            "sha256": model_info.sha256,
            "arch": model_info.arch,
            "vocab_size": model_info.vocab_size,
        },
        "parallelism": parallelism(engine_info, backend_info),
        "engine_info": engine_info,
        "backend_info": backend_info,
        "versions": package_versions(),
        "device": device_info(),
        "env": numerics_env(),
        "python_executable": sys.executable,
    }
    return {"fingerprint": stack_fingerprint(stack), **stack}


def stack_fingerprint(stack: Mapping[str, Any]) -> str:
    """The hash of a recorded stack (report.json's, or a certificate's without its volatile
    fields) over all of it but where it runs from: the Python executable, the model's path and
    the info fields that differ between runs (``VOLATILE_INFO``). ``certify --check``
    recomputes a certificate's fingerprint with it, so an edited stack or fingerprint shows."""
    hashed = {k: v for k, v in stack.items() if k not in ("fingerprint", "python_executable")}
    hashed["model"] = {k: v for k, v in stack["model"].items() if k != "path"}
    for key in ("engine_info", "backend_info"):
        hashed[key] = {k: v for k, v in stack[key].items() if k not in VOLATILE_INFO}
    canonical = json.dumps(hashed, sort_keys=True, default=str).encode()
    return hashlib.sha256(canonical).hexdigest()
