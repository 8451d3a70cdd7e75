"""A stack spec checked before anything starts, and made the stack to run.

Fail fast on what the user can fix: the profile, the engine and backend (installed, the options
they take, the releases they support), the model folder, a run shape the model cannot hold.
Then the stack to run: on a CPU its batches within the model's cost; where the profile was
calibrated on another model or device, a named one stays (a one-line warning says so) and an
implied one gives way to the model's own (:func:`conformance.calibration.own_profile.own_profile`:
calibrated once, cached). certify and the plugin both call :func:`preflight`, once per spec;
``tim-conformance check``, which starts the stack and judges none of it, loads only a profile the
launch names (held to the certificate's) and calibrates none.
"""

from __future__ import annotations

from dataclasses import replace

from conformance import releases
from conformance.backends import BACKENDS
from conformance.engines import ENGINES
from conformance.host import device_info
from conformance.models import inspect_model
from conformance.profiles import load_profile
from conformance.stack import StackSpec


def preflight(spec: StackSpec, *, judged: bool = True) -> StackSpec:
    """``spec`` checked, and the stack to run (see the module's docstring); a UsageError line
    for what the user can fix. Not ``judged``: a stack that is only started, never held to a
    profile (``tim-conformance check``), whose profile is loaded only where the launch names it (a
    bad one refused before anything starts) and never calibrated: the launch does not depend
    on it, and a model's own profile is cached only where it was calibrated."""
    profile = load_profile(spec.profile) if judged or "profile" in spec.named else None
    for line in profile.ignored if profile is not None else ():
        releases.warn(line)
    engine, backend = ENGINES.get(spec.engine), BACKENDS.get(spec.backend)
    engine.check_options(spec.engine_options)
    backend.check_options(spec.backend_options)
    model = inspect_model(spec.model_dir())
    device = device_info()
    foreign = profile.foreign_to(model.sha256, device) if profile is not None else None
    context = model.max_position_embeddings
    spec.depth.check_fits(context)
    shape = spec.depth.for_host(model, device)
    # an own profile's calibration draws up to it (cheap: the depth's limits against the context)
    cap = spec.depth.calibration_cap(context)
    # one line for both, once every input passed, before the model is built or anything starts
    releases.warn(
        releases.check_stack(
            {
                f"engine {spec.engine!r}": engine.capabilities.releases,
                f"backend {spec.backend!r}": backend.RELEASES,
            }
        )
    )
    if shape != spec.depth:
        releases.warn(f"drawing at depth {shape.describe()}")
    # the shipped profiles hold caches in the model's precision: a lossy cache needs its own
    kv_format = spec.kv_format
    costed = replace(spec, depth=shape)
    if profile is None or not (foreign or kv_format) or spec.profile_named:
        releases.warn(foreign)
        return costed
    # calibration (and Hypothesis, which it draws with) is loaded only where it runs
    from conformance.calibration.own_profile import own_profile

    own = own_profile(
        model,
        costed.engine_dtype,
        costed.backend_dtype,
        shape.name,
        cap=cap,
        max_tokens=shape.max_batch_tokens if shape.budget != "depth" else None,
        attn_implementation=costed.backend_attn,
        kv_format=kv_format,
    )
    return replace(costed, profile=str(own), profile_named=True)
