"""Engine registry. Adding an engine adds one module and one line here."""

from conformance.engines.base import Completion, Engine, EngineConfig, LogprobKind, SamplingSpec
from conformance.registry import Registry

ENGINES: Registry[Engine] = Registry("engine")
ENGINES.register("hf-generate", "conformance.engines.hf_generate:HFGenerateEngine")

__all__ = ["ENGINES", "Completion", "Engine", "EngineConfig", "LogprobKind", "SamplingSpec"]
