"""Model families keyed by ``config.architectures[0]``, imported lazily; unknown architectures go to the
generic ``transformers`` fallback, and so does a known architecture whose config sets an option its native
family does not implement (``native_gaps`` names them; the model then carries ``fallback_reason``). The same
decision from the config alone, without torch, is ``native.config_runtime_path`` (the planner's)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from agents.runtime.interface import RuntimeModel
from contract.model.native import NATIVE_FAMILIES, architecture_of, decoder_gap

_REGISTRY: dict[str, type] = {}
_FAMILY_MODULES = NATIVE_FAMILIES  # architecture -> module (``native.py``: the planner reads it without torch)


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


def native_gaps(config: dict[str, Any]) -> list[str]:
    """The options in ``config`` that the native layers do not implement (empty: the native family runs it).
    Each is checked against the native code itself (its RoPE frequencies, its activation check), not a list
    kept here."""
    from agents.runtime.layers.mlp import check_activation
    from agents.runtime.layers.rotary import inv_frequencies, rope_parameters

    for key in ("rope_scaling", "rope_parameters"):
        if config.get(key) is not None and not isinstance(config[key], dict):
            raise ValueError(f"{key} must be an object, got {type(config[key]).__name__}")
    gaps: list[str] = []
    rope = rope_parameters(config)
    head_dim = config.get("qk_rope_head_dim") or config.get("head_dim") or 64
    try:
        inv_frequencies(rope, int(head_dim), int(config.get("max_position_embeddings") or 4096))
    except (ValueError, KeyError, TypeError, ZeroDivisionError) as exc:
        detail = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
        gaps.append(f"rope_scaling of type {rope['rope_type']!r} ({detail})")
    try:
        check_activation(config.get("hidden_act"))
    except ValueError:
        gaps.append(f"hidden_act {config.get('hidden_act')!r} (the native MLP is SwiGLU with silu)")
    if config.get("mlp_bias"):
        gaps.append("mlp_bias true (the native MLP has no biases)")
    scoring = config.get("scoring_func")
    if config.get("n_routed_experts") and scoring not in (None, "sigmoid", "softmax"):
        gaps.append(f"scoring_func {scoring!r} (the native router scores with sigmoid or softmax)")
    return gaps


def runtime_path(config: dict[str, Any]) -> tuple[str, str | None]:
    """("native", None), or ("fallback", why): what ``build_model`` will run for this config."""
    arch = architecture_of(config)
    if model_class_for(arch) is None:
        return "fallback", f"architecture {arch!r} has no native implementation"
    text = config.get("text_config")
    gaps = native_gaps(text if isinstance(text, dict) else config)  # a vision-language model: its decoder's
    decoder = decoder_gap(config)  # a decoder the native family does not have (LLaVA on a Qwen2 decoder)
    if decoder:
        gaps.insert(0, decoder)
    if gaps:
        return "fallback", f"the native {arch} does not implement: {'; '.join(gaps)}"
    return "native", None


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
    path, reason = runtime_path(config)
    if path == "fallback":
        from agents.runtime.distributed import get_ep_world_size, get_pp_world_size, get_tp_world_size

        if get_tp_world_size() > 1 or get_ep_world_size() > 1 or get_pp_world_size() > 1:
            raise NotImplementedError(f"{reason}, and the transformers fallback runs on one device only "
                                      "(no TP/EP/PP)")
        try:
            from agents.runtime.models.fallback import FallbackModel
        except ModuleNotFoundError as exc:
            raise NotImplementedError(f"{reason} and the generic fallback is unavailable ({exc})") from exc
        model = FallbackModel(config, dtype=dtype, device=device)
        model.fallback_reason = reason
        return model
    cls = model_class_for(arch)
    with torch.device(device), default_dtype(dtype):
        model = cls(config)
    return model.eval()
