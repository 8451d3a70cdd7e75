"""Backend registry. Adding a backend adds one module and one line here."""

from conformance.backends.base import Backend, BackendConfig, Recompute
from conformance.registry import Registry

BACKENDS: Registry[Backend] = Registry("backend")
BACKENDS.register("hf", "conformance.backends.hf:HFBackend")
BACKENDS.register("fsdp", "conformance.backends.fsdp:FSDPBackend")

__all__ = ["BACKENDS", "Backend", "BackendConfig", "Recompute"]
