"""A stack spec checked before anything starts, and made the stack to run.

Fail fast on what the user can fix: the profile, the engine and backend (installed, the options
they take, the releases they support), the model folder, a run shape the model cannot hold.
Then the stack to run: on a CPU its batches within the model's cost; where the profile was
calibrated on another model or device, a named one stays (a one-line warning says so) and an
implied one gives way to the model's own (:func:`conformance.calibration.own_profile.own_profile`:
calibrated once, cached). certify and the plugin both call :func:`preflight`, once per spec.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from conformance import releases
from conformance.backends import BACKENDS
from conformance.depth import Depth, depth, forward_weights
from conformance.dtypes import engine_kv_format
from conformance.engines import ENGINES
from conformance.errors import UsageError
from conformance.host import device_info
from conformance.models import ModelInfo, inspect_model
from conformance.profiles import load_profile
from conformance.stack import StackSpec


def preflight(spec: StackSpec) -> StackSpec:
    """``spec`` checked, and the stack to run (see the module's docstring); a UsageError line
    for what the user can fix."""
    profile = load_profile(spec.profile)
    engine, backend = ENGINES.get(spec.engine), BACKENDS.get(spec.backend)
    engine.check_options(spec.engine_options)
    backend.check_options(spec.backend_options)
    model = inspect_model(spec.model_dir())
    context = model.max_position_embeddings
    # the depth's own limits, which a run shape replaced where it differs from them
    base = depth(spec.depth.name)
    _check_run_shape(spec.depth, base, context)
    # one line for both, once every input passed, before the model is built or anything starts
    releases.warn(
        releases.check_stack(
            {
                f"engine {spec.engine!r}": engine.capabilities.releases,
                f"backend {spec.backend!r}": backend.RELEASES,
            }
        )
    )
    device = device_info()
    costed = within_cost(spec, model, device)
    if costed.depth != spec.depth:
        # once per process, as the warnings are
        releases.warn(f"drawing at depth {costed.depth.describe()}")
    foreign = profile.foreign_to(model.sha256, device)
    # the shipped profiles hold caches in the model's precision: a lossy cache needs its own
    kv_format = engine_kv_format(spec.engine_options.get("kv_cache_dtype"))
    if (foreign or kv_format) and not spec.profile_named:
        # calibration (and Hypothesis, which it draws with) is loaded only where it runs
        from conformance.calibration.own_profile import own_profile

        shape = costed.depth
        own = own_profile(
            model,
            costed.engine_dtype,
            costed.backend_dtype,
            shape.name,
            cap=_calibration_cap(spec.depth, base, context),
            max_tokens=shape.max_batch_tokens if shape.budget != "depth" else None,
            attn_implementation=costed.backend_attn,
            kv_format=kv_format,
        )
        return replace(costed, profile=str(own), profile_named=True)
    releases.warn(foreign)
    return costed


def within_cost(spec: StackSpec, model: ModelInfo, device: dict[str, Any]) -> StackSpec:
    """On a CPU, ``spec`` with its batches' token budget sized to the model's cost
    (:meth:`conformance.depth.Depth.within_cost`): an accelerator holds the depth's own."""
    if device.get("kind") != "cpu":
        return spec
    weights = forward_weights(
        hidden_size=model.hidden_size, num_layers=model.num_layers, vocab_size=model.vocab_size
    )
    return replace(spec, depth=spec.depth.within_cost(weights, model.max_position_embeddings))


def _check_run_shape(shape: Depth, base: Depth, context: int | None) -> None:
    """A run shape the model cannot hold is an error, not a silently shorter run (a depth's
    own limits, ``base``, are clamped to the model's context instead)."""
    if context is None or shape.max_prompt_len is None or shape == base:
        return
    # one more position: an engine scores a sequence by generating one token after it
    needed = shape.max_prompt_len + shape.max_new_tokens + 1
    if needed > context:
        raise UsageError(
            f"--max-prompt-len {shape.max_prompt_len} + --max-new-tokens "
            f"{shape.max_new_tokens} (+1) needs {needed} positions; the model has {context}",
            f"pass a shorter run shape, at most {context - 1} tokens together",
        )


def _calibration_cap(shape: Depth, base: Depth, context: int | None) -> tuple[int, int, int] | None:
    """A run shape given in place of the depth's limits (``base``) caps what its own profile is
    calibrated on (prompts, prompt length, new tokens); None for the depth's own."""
    unbounded = context or 1 << 30
    cap = (shape.max_batch, shape.max_prompt_len or unbounded, shape.max_new_tokens)
    limits = (base.max_batch, base.max_prompt_len or unbounded, base.max_new_tokens)
    # a shape at or above the depth's calibrates as the depth does, and shares its cache
    return cap if any(c < limit for c, limit in zip(cap, limits, strict=True)) else None
