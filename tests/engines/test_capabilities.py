"""An engine's capabilities are one value (``EngineCapabilities``): declared once, shared by the
adapters of one engine, and still built from the old class attributes for one release."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import pytest

from conformance.engines import EngineCapabilities, EngineConfig, SamplingSpec
from conformance.engines.base import DEPRECATED_ATTRIBUTES
from conformance.engines.hf_generate import HFGenerateEngine
from conformance.sampling import SamplerOrder


def test_every_capability_has_the_attribute_it_replaces() -> None:
    fields = {f.name for f in dataclasses.fields(EngineCapabilities)}
    assert sorted(DEPRECATED_ATTRIBUTES.values()) == sorted(fields)


def test_a_declared_value_cannot_change_under_the_harness() -> None:
    options = {"enable_prefix_caching": "true"}
    declared = EngineCapabilities(prefix_cache=options)
    options["enable_prefix_caching"] = "false"
    assert declared.prefix_cache == {"enable_prefix_caching": "true"}
    with pytest.raises(TypeError):
        declared.prefix_cache["enable_prefix_caching"] = "false"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        declared.min_p = True  # type: ignore[misc]


def test_the_adapters_of_one_engine_share_their_capabilities() -> None:
    # importing the adapters imports neither vLLM nor SGLang
    from conformance.engines import _sglang_common, _vllm_common
    from conformance.engines.sglang import SGLangEngine
    from conformance.engines.sglang_server import SGLangServerEngine
    from conformance.engines.vllm import VLLMEngine
    from conformance.engines.vllm_server import VLLMServerEngine

    assert SGLangEngine.capabilities is SGLangServerEngine.capabilities
    assert SGLangEngine.capabilities is _sglang_common.CAPABILITIES
    assert VLLMServerEngine.capabilities is _vllm_common.CAPABILITIES
    # the in-process engine adds its prefix cache's option, and nothing else
    assert VLLMEngine.capabilities == dataclasses.replace(
        _vllm_common.CAPABILITIES, prefix_cache={"enable_prefix_caching": "true"}
    )


def test_a_class_declaring_capabilities_raises_no_warning() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        class WithoutMinP(HFGenerateEngine):
            capabilities = dataclasses.replace(HFGenerateEngine.capabilities, min_p=False)

    assert WithoutMinP.capabilities.min_p is False
    assert WithoutMinP.capabilities.parallel_sampling is True


def test_the_old_attributes_still_declare_for_one_release(default_model: Path) -> None:
    """A third-party engine written against the old attributes: the harness builds its
    capabilities from them, on top of its parent's, and warns once per attribute, at the class
    statement, naming the field to declare instead."""
    with pytest.warns(DeprecationWarning) as caught:

        class OldStyle(HFGenerateEngine):
            name = "old-style"
            MIN_P = False
            SAMPLER_ORDER = SamplerOrder.JOINT

    messages = sorted(str(w.message) for w in caught)
    assert len(messages) == 2, messages
    assert "OldStyle.MIN_P is deprecated" in messages[0]
    assert "EngineCapabilities(min_p=...)" in messages[0]
    assert "OldStyle.SAMPLER_ORDER is deprecated" in messages[1]
    assert "EngineCapabilities(sampler_order=...)" in messages[1]
    assert {w.filename for w in caught} == {__file__}
    assert OldStyle.capabilities == dataclasses.replace(
        HFGenerateEngine.capabilities, min_p=False, sampler_order=SamplerOrder.JOINT
    )
    # what the harness reads from the engine follows: the fingerprint records the declared order
    engine = OldStyle(EngineConfig(model=default_model))
    try:
        assert engine.info()["sampler_order"] == SamplerOrder.JOINT.value
        (completion,) = engine.generate([[5, 6, 7]], SamplingSpec(max_new_tokens=2))
        assert len(completion.tokens) == 2
    finally:
        engine.close()
