"""The stack under test as one typed value: the options' values assembled (each converted by
its option, :mod:`conformance.options`), how to build its engine and backend, and the flags
that spell it. Checking it against the host and the model is :mod:`conformance.preflight`'s;
what a certificate pins down of a started stack, :mod:`conformance.fingerprint`'s."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypedDict, Unpack

from conformance import options
from conformance.backends import BackendConfig
from conformance.backends.base import Layout
from conformance.depth import Depth, depth
from conformance.dtypes import engine_kv_format
from conformance.engines import EngineConfig, LogprobKind
from conformance.models import declared_experts, default_model
from conformance.options import MAX_BATCH_TOKENS, RUN_SHAPE_OPTIONS, implied_profile

_DEFAULT_LOGPROBS: LogprobKind = options.LOGPROBS.default_value()


class _BackendChanges(TypedDict, total=False):
    """What :meth:`StackSpec.backend_config` may change of the stack's :class:`BackendConfig`
    (its fields but the model)."""

    dtype: str
    micro_batch_size: int
    layout: Layout
    attn_implementation: str
    options: Mapping[str, str]


@dataclass(frozen=True)
class StackSpec:
    """Everything that defines a run, resolved and validated."""

    # each default is its option's (conformance.options), converted
    engine: str = options.ENGINE.default_value()
    backend: str = options.BACKEND.default_value()
    model: Path | None = None
    engine_dtype: str = options.ENGINE_DTYPE.default_value()
    backend_dtype: str = options.BACKEND_DTYPE.default_value()
    profile: str = implied_profile(
        options.ENGINE_DTYPE.default_value(), options.BACKEND_DTYPE.default_value()
    )
    #: whether the user named the profile; an implied one that was measured on another model or
    #: device gives way to the model's own (:func:`conformance.preflight.preflight`)
    profile_named: bool = True
    examples: int = options.EXAMPLES.default_value()
    depth: Depth = field(default_factory=options.DEPTH.default_value)
    #: seconds Hypothesis may spend shrinking a failure
    shrink_seconds: float = options.SHRINK_SECONDS.default_value()
    logprobs: LogprobKind = _DEFAULT_LOGPROBS
    engine_options: dict[str, str] = field(default_factory=dict)
    backend_micro_batch: int = options.BACKEND_MICRO_BATCH.default_value()
    backend_attn: str = options.BACKEND_ATTN.default_value()
    backend_options: dict[str, str] = field(default_factory=dict)
    #: seconds one engine or backend call may take before the run ends incomplete (hung)
    call_timeout: float = options.CALL_TIMEOUT.default_value()
    #: seconds an engine or backend may take to start
    start_timeout: float = options.START_TIMEOUT.default_value()
    #: the options the user gave a value (the command line, an ini file, a project table), not a
    #: default nor a certificate's recorded one: the values a ``tim-conformance check`` launch
    #: names
    named: frozenset[str] = field(default=frozenset(), compare=False)

    @classmethod
    def from_options(
        cls,
        given: Mapping[str, Any],
        *fallbacks: Mapping[str, Any],
        recorded: Mapping[str, Any] | None = None,
    ) -> StackSpec:
        """The stack the option values name, each converted by its option
        (:func:`conformance.options.resolve`: ``given`` keyed by ``Option.dest``, then each
        fallback table, then the default); ``recorded``, a certificate's values, names the
        stack instead of the fallbacks where ``given`` names no stack option. Assembled: the
        profile the dtypes (and a MoE model) imply where none is named, the run shape over the
        depth's limits, an ``--engine-url`` among the engine options."""
        if recorded is not None and not options.stack_given(given):
            # the launch names no value: the certificate's are the stack's own
            fallbacks, named = (recorded,), frozenset[str]()
        else:
            named = options.named(given, *fallbacks)
        values = options.resolve(given, *fallbacks)
        model: Path | None = values["model"]
        engine_dtype, backend_dtype = values["engine-dtype"], values["backend-dtype"]
        moe = model is not None and declared_experts(model) > 0
        shape = {
            option.name.replace("-", "_"): values[option.name]
            for option in RUN_SHAPE_OPTIONS
            if values[option.name] is not None
        }
        url = {"url": values["engine-url"]} if values["engine-url"] else {}
        return cls(
            engine=values["engine"],
            backend=values["backend"],
            model=model,
            engine_dtype=engine_dtype,
            backend_dtype=backend_dtype,
            profile=values["profile"] or implied_profile(engine_dtype, backend_dtype, moe=moe),
            profile_named=bool(values["profile"]),
            examples=values["examples"],
            depth=values["depth"].with_run_shape(**shape),
            shrink_seconds=values["shrink-seconds"],
            logprobs=values["logprobs"],
            engine_options={**values["engine-option"], **url},
            backend_micro_batch=values["backend-micro-batch"],
            backend_attn=values["backend-attn"],
            backend_options=values["backend-option"],
            call_timeout=values["call-timeout"],
            start_timeout=values["start-timeout"],
            named=named,
        )

    @property
    def kv_format(self) -> str | None:
        """The format the engine's KV cache holds keys and values in (its ``kv_cache_dtype``
        option, :func:`conformance.dtypes.engine_kv_format`); None where it keeps the model's
        precision."""
        return engine_kv_format(self.engine_options.get("kv_cache_dtype"))

    def model_dir(self) -> Path:
        if self.model is not None:
            return self.model

        return default_model()

    def engine_config(self, model: Path, **option_changes: str) -> EngineConfig:
        return EngineConfig(
            model=model,
            dtype=self.engine_dtype,
            logprobs=self.logprobs,
            options={**self.engine_options, **option_changes},
        )

    def backend_config(self, model: Path, **changes: Unpack[_BackendChanges]) -> BackendConfig:
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
        commands): the stack itself reaches the plugin as this object."""
        return options.flags(self.option_values(), prefix="tim-")
