"""``CompiledModel``: the compiled region installed on a built native decoder (its layers' forwards routed through
``torch.compile`` of ``DecoderLayer.forward``, attention and routed experts as opaque ops), and removed again."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from agents.runtime.engine.compiled.opaque_ops import (
    ATTENTION,
    EXPERTS,
    HOOKS,
    KEY,
    ORIGINAL,
    STEP,
    patch_attention,
    patch_experts,
)
from agents.runtime.engine.compiled.stats import CompileStats, counter_snapshot, graph_count
from agents.runtime.engine.compiled.toolchain import (
    CompileUnavailable,
    check_cpp_compiler,
    check_triton,
    configure_caches,
)


@contextmanager
def inductor_gemms() -> Iterator[None]:
    """Inside the compiled region the linears call ``F.linear`` and Inductor picks the GEMM: the eager path's
    direct oneDNN call (``layers/linear.py``, ``mkldnn._linear_pointwise``) lowers only on frozen weights, and
    freezing would bake one layer's weights into the region every layer shares. The switch is a module flag
    read while Dynamo traces; Dynamo guards on it, so it must hold the same value on every compiled call."""
    from agents.runtime.layers import linear

    saved = getattr(linear, "_ONEDNN", None)
    if saved is None:
        yield
        return
    linear._ONEDNN = False
    try:
        yield
    finally:
        linear._ONEDNN = saved


def _decoder_layers(model: nn.Module) -> list[nn.Module]:
    from agents.runtime.layers.attention import Attention
    from agents.runtime.models.decoder import DecoderLayer

    layers = list(getattr(model, "stage_layers", []) or [])
    if not layers or not all(type(layer) is DecoderLayer for layer in layers):
        raise CompileUnavailable(
            f"{type(model).__name__} is not a native decoder of DecoderLayer blocks: the compiled path covers "
            "the native families (the transformers fallback runs eager)")
    if not all(isinstance(getattr(layer.self_attn, "attn", None), Attention) or _is_mla(layer.self_attn)
               for layer in layers):
        raise CompileUnavailable(f"{type(model).__name__}: the compiled path covers paged GQA attention and MLA "
                                 "layers")
    return layers


def _is_mla(module: nn.Module) -> bool:
    from agents.runtime.layers.mla import MLAttention

    return isinstance(module, MLAttention)


def _attention_of(layer: nn.Module) -> nn.Module:
    """What runs eager as an op: the paged ``Attention`` inside the block, or the whole MLA block."""
    return layer.self_attn if _is_mla(layer.self_attn) else layer.self_attn.attn


class CompiledModel:
    """The compiled path installed on a built model: its decoder layers run the compiled region, the rest of
    the forward (metadata, embedding, final norm, logits) stays eager. ``enabled`` False runs the eager
    layers again (the same model compared both ways)."""

    def __init__(self, model: nn.Module, *, device: torch.device | str = "cpu",
                 cache_dir: str | Path | None = None) -> None:
        self.model = model
        self.device = torch.device(device)
        if torch.distributed.is_available() and torch.distributed.is_initialized() and (
                torch.distributed.get_world_size() > 1):
            raise CompileUnavailable("the compiled path serves one process (tp, pp and ep 1): the collectives of "
                                     "a multi-rank step run eager for now")
        self.layers = _decoder_layers(model)
        compiler = check_cpp_compiler() if self.device.type == "cpu" else check_triton(self.device)
        cache = configure_caches(cache_dir)
        self.stats = CompileStats(device=str(self.device), cache_dir=str(cache), compiler=compiler,
                                  layers=len(self.layers), baseline=counter_snapshot())
        self.enabled = True
        from agents.runtime.models.decoder import DecoderLayer

        self._region = torch.compile(DecoderLayer.forward, dynamic=True, backend="inductor")
        for layer in self.layers:
            self._install(layer)
        self._wrap_model_forward()
        model.prune_last_layer = False  # the last layer runs the compiled region on every row, as the others
        model.native_decode = False  # every step runs the compiled region (the native decode would bypass it)

    def _install(self, layer: nn.Module) -> None:
        if hasattr(layer, ORIGINAL):
            raise CompileUnavailable("the compiled path is already installed on this model")
        attn = _attention_of(layer)
        patch_attention(attn, self.device, whole=_is_mla(attn))
        experts = getattr(layer.mlp, "experts", None)
        if experts is not None and hasattr(experts, "w13"):
            patch_experts(experts)
        eager = layer.forward
        setattr(layer, ORIGINAL, eager)
        region = self._region

        def forward(x: torch.Tensor, meta: Any) -> torch.Tensor:
            if not self.enabled:
                return eager(x, meta)
            STEP.meta = meta
            try:
                with inductor_gemms():
                    return region(layer, x, meta)
            finally:
                STEP.meta = None

        layer.forward = forward

    def _wrap_model_forward(self) -> None:
        """Wrap the model's ``forward`` to time the calls that compile and count steps."""
        eager_forward = self.model.forward
        stats = self.stats

        def forward(*args: Any, **kwargs: Any) -> Any:
            if not self.enabled:
                return eager_forward(*args, **kwargs)
            before = graph_count()
            started = time.perf_counter()
            out = eager_forward(*args, **kwargs)
            compiled = graph_count() - before
            with stats._lock:
                stats.steps += 1
                if compiled:
                    stats.compile_seconds += time.perf_counter() - started
                    stats.compiling_calls += 1
                    if stats.warm:
                        stats.recompiles_after_warmup += compiled
            return out

        self.model.forward = forward

    def mark_warm(self) -> None:
        """The warm-up is done: later graphs count as recompiles in service."""
        self.stats.warm = True
        self.stats.warmup_counts = self.stats.deltas()

    def remove(self) -> None:
        """Restore the eager forwards and hooks (the model is then as it was built)."""
        for layer in self.layers:
            attn = _attention_of(layer)
            key = attn.__dict__.pop(KEY, None)
            if key is not None:
                ATTENTION.pop(key.data_ptr(), None)
            for module in (layer, attn, getattr(layer.mlp, "experts", None)):
                if module is None or not hasattr(module, ORIGINAL):
                    continue
                delattr(module, ORIGINAL)
                module.__dict__.pop("forward", None)
                for key, hook in module.__dict__.pop(HOOKS, []):
                    module._forward_pre_hooks[key] = hook
                if module is not layer and module is not attn:
                    EXPERTS.pop(module.w13.data_ptr(), None)
        self.model.__dict__.pop("forward", None)
        self.model.prune_last_layer = True
        from agents.runtime.models.native_decode import native_decode_enabled

        self.model.native_decode = native_decode_enabled()
