"""Model families keyed by ``config.architectures[0]``, imported lazily; unknown architectures go to the
generic ``transformers`` fallback."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from agents.runtime.interface import RuntimeModel

_REGISTRY: dict[str, type] = {}
_FAMILY_MODULES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}


def register(*architectures: str) -> Callable[[type], type]:
    """Class decorator: ``@register("LlamaForCausalLM", "MistralForCausalLM")``."""

    def wrap(cls: type) -> type:
        for arch in architectures:
            _REGISTRY[arch] = cls
        return cls

    return wrap


def model_class_for(architecture: str | None) -> type | None:
    """The native class for an architecture, or None when there is none (the fallback then runs it)."""
    if architecture is None:
        return None
    if architecture not in _REGISTRY and architecture in _FAMILY_MODULES:
        name = f"agents.runtime.models.{_FAMILY_MODULES[architecture]}"
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
    return _REGISTRY.get(architecture)


def architecture_of(config: dict[str, Any]) -> str:
    archs = config.get("architectures") or []
    if not archs or not isinstance(archs[0], str):
        raise ValueError("config.json has no 'architectures' list: cannot pick a model family")
    return archs[0]


@contextmanager
def default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def build_model(config: dict[str, Any], *, dtype: torch.dtype = torch.float32,
                device: torch.device | str = "cpu") -> RuntimeModel:
    """An empty model (weights not loaded) on ``device``: native when registered, else the generic fallback.
    TP/EP layout comes from ``agents.runtime.distributed``."""
    arch = architecture_of(config)
    cls = model_class_for(arch)
    if cls is None:
        try:
            from agents.runtime.models.fallback import FallbackModel
        except ModuleNotFoundError as exc:
            raise NotImplementedError(
                f"architecture {arch!r} has no native implementation and the generic fallback is unavailable ({exc})"
            ) from exc
        return FallbackModel(config, dtype=dtype, device=device)
    with torch.device(device), default_dtype(dtype):
        model = cls(config)
    return model.eval()
