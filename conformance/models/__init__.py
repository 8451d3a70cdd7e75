"""The embedded model zoo: tiny random causal LMs built offline, and checks on model folders."""

import os

# nothing in the zoo needs the hub; make sure transformers never tries it
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from conformance.models.build import ARCHS, ModelStats, make_model
from conformance.models.cache import cached_model, default_model, model_folder
from conformance.models.info import ModelInfo, declared_experts, inspect_model

__all__ = [
    "ARCHS",
    "ModelInfo",
    "ModelStats",
    "cached_model",
    "declared_experts",
    "default_model",
    "inspect_model",
    "make_model",
    "model_folder",
]
