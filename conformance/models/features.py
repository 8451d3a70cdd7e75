"""A model's distinguishing features, read from its config.json: what a conformance run must
exercise before it can speak for the model.

Each feature is reached by a check whose longest drawn sequence holds more than
``from_position`` tokens: a sliding window of W keys is exercised only past W tokens (an engine
that keeps W + 1 keys, or none past the window, agrees with one that is right until then), a
RoPE scaling only past the original context, an SSM's chunked prefill only across a chunk
boundary. Features that act on every token (a logit soft-cap, logit scaling, attention sinks,
shared experts) have ``from_position`` 0: any check that measured a token reached them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

#: model types whose attention adds learned sink logits (their configs carry no flag for it)
SINK_MODEL_TYPES = frozenset({"gpt_oss"})


@dataclass(frozen=True)
class ModelFeature:
    """One feature: its name, what it is in this model, and from which position it acts."""

    name: str
    what: str
    from_position: int = 0

    def reached_by(self, sequence_len: int) -> bool:
        """Whether a check whose longest sequence held ``sequence_len`` tokens exercised it."""
        return sequence_len > self.from_position


def model_features(config: Mapping[str, Any]) -> tuple[ModelFeature, ...]:
    """The features of the model a config.json describes, in a fixed order."""
    return tuple(_features(config))


def _features(config: Mapping[str, Any]) -> Iterator[ModelFeature]:
    window = _sliding_window(config)
    if window:
        yield ModelFeature("sliding_window", f"sliding window of {window} keys", window)
    for rope_type, original in _rope_scalings(config):
        yield ModelFeature(
            "rope_scaling", f"{rope_type} RoPE scaling past {original} positions", original
        )
    chunk = config.get("mamba_chunk_size") or (
        config.get("chunk_size") if config.get("model_type", "").startswith("mamba") else None
    )
    if chunk:
        yield ModelFeature(
            "ssm_chunk", f"SSM state carried across prefill chunks of {chunk} tokens", chunk
        )
    if "linear_attention" in (config.get("layer_types") or []):
        yield ModelFeature("linear_attention", "linear-attention layers' recurrent state")
    for key, name in (
        ("final_logit_softcapping", "final_logit_softcap"),
        ("attn_logit_softcapping", "attention_softcap"),
    ):
        if config.get(key):
            yield ModelFeature(name, f"{key} {config[key]}")
    for key in ("logits_scaling", "logit_scale"):
        if config.get(key) not in (None, 1, 1.0):
            yield ModelFeature("logit_scale", f"{key} {config[key]}")
    if config.get("model_type") in SINK_MODEL_TYPES:
        yield ModelFeature("attention_sinks", "learned attention sink logits")
    experts = config.get("num_experts") or config.get("num_local_experts") or 0
    experts = experts or config.get("n_routed_experts") or 0
    if experts:
        if config.get("shared_expert_intermediate_size") or config.get("n_shared_experts"):
            yield ModelFeature("shared_experts", "shared experts beside the routed ones")
        if config.get("mlp_only_layers") or config.get("first_k_dense_replace"):
            yield ModelFeature("dense_layers", "dense MLP layers among the MoE ones")
        if config.get("norm_topk_prob") is False:
            yield ModelFeature("unnormalised_topk", "top-k routing weights not renormalised")


def _sliding_window(config: Mapping[str, Any]) -> int | None:
    """The window, where some layer uses one (``use_sliding_window`` false turns it off, as
    transformers reads it; ``layer_types`` without a sliding layer too)."""
    window = config.get("sliding_window")
    if not window or config.get("use_sliding_window") is False:
        return None
    kinds = config.get("layer_types")
    if kinds and "sliding_attention" not in kinds:
        return None
    return int(window)


def _rope_scalings(config: Mapping[str, Any]) -> Iterator[tuple[str, int]]:
    """(RoPE type, original context) of each scaled RoPE; per layer type where the config keys
    them so (``rope_parameters`` of ``{"full_attention": {...}, ...}``)."""
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    nested = (
        rope.values() if all(isinstance(v, Mapping) for v in rope.values()) and rope else [rope]
    )
    seen: set[tuple[str, int]] = set()
    for params in nested:
        rope_type = params.get("rope_type") or params.get("type") or "default"
        original = params.get("original_max_position_embeddings")
        if rope_type != "default" and original and (rope_type, int(original)) not in seen:
            seen.add((rope_type, int(original)))
            yield rope_type, int(original)
