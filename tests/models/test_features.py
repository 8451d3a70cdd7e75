"""A model's features, read from config.json: each family make-model builds carries the ones
that distinguish it, a plain decoder none, and a feature is reached exactly past its position."""

from __future__ import annotations

import json

import pytest

from conformance.models import ARCHS, make_model
from conformance.models.build import ROPE_ORIGINAL_POSITIONS, SSM_CHUNK, WINDOW
from conformance.models.features import ModelFeature, model_features

#: --arch → the features (name, from which position) its model must declare
EXPECTED = {
    "llama": [],
    "qwen2": [],
    "qwen3": [],
    "qwen3-moe": [],
    "gemma2": [("sliding_window", WINDOW), ("final_logit_softcap", 0), ("attention_softcap", 0)],
    "mistral": [("sliding_window", WINDOW)],
    "gpt-oss": [
        ("sliding_window", WINDOW),
        ("rope_scaling", ROPE_ORIGINAL_POSITIONS),
        ("attention_sinks", 0),
    ],
    "granite": [("logit_scale", 0)],
    "cohere": [("logit_scale", 0)],
    "qwen2-moe": [("shared_experts", 0), ("dense_layers", 0), ("unnormalised_topk", 0)],
    "bamba": [("ssm_chunk", SSM_CHUNK)],
    "llama-rope-scaled": [("rope_scaling", ROPE_ORIGINAL_POSITIONS)],
}


def test_every_family_is_listed_here() -> None:
    assert set(EXPECTED) == set(ARCHS)


@pytest.mark.parametrize("arch", sorted(EXPECTED))
def test_each_family_declares_its_features(tmp_path, arch: str) -> None:
    built = make_model(tmp_path / arch, arch=arch, layers=2)
    config = json.loads((built.path / "config.json").read_text())
    found = [(f.name, f.from_position) for f in model_features(config)]
    assert found == EXPECTED[arch]


def test_a_window_is_reached_only_past_it() -> None:
    window = ModelFeature("sliding_window", "sliding window of 64 keys", 64)
    assert not window.reached_by(64) and window.reached_by(65)
    assert ModelFeature("logit_scale", "logit_scale 0.0625").reached_by(1)


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        # Qwen2's flag turns the window off, as transformers reads it
        ({"model_type": "qwen2", "sliding_window": 4096, "use_sliding_window": False}, []),
        # a window no layer uses
        ({"sliding_window": 64, "layer_types": ["full_attention"] * 2}, []),
        # Gemma-3's RoPE per layer type: each scaling once
        (
            {
                "rope_parameters": {
                    "full_attention": {
                        "rope_type": "linear",
                        "factor": 8.0,
                        "original_max_position_embeddings": 8192,
                    },
                    "sliding_attention": {"rope_type": "default"},
                }
            },
            [("rope_scaling", 8192)],
        ),
        # hybrid linear attention (Qwen3-Next's layer kinds)
        ({"layer_types": ["linear_attention", "full_attention"]}, [("linear_attention", 0)]),
        ({"logits_scaling": 1.0}, []),
    ],
)
def test_features_of_configs_from_other_families(config, expected) -> None:
    assert [(f.name, f.from_position) for f in model_features(config)] == expected
