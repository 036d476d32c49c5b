"""The opaque ops of the compiled region: paged attention (``day0::paged_attention``), a whole MLA block
(``day0::whole_attention``) and the routed experts (``day0::routed_experts``) run eager inside the graph, and the
patches that route a layer's modules to them while Dynamo traces (see the package docstring for why)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


class _Step(threading.local):
    meta: Any = None  # the running layer's AttentionMetadata


STEP = _Step()
ATTENTION: dict[int, nn.Module] = {}  # a layer key's data_ptr -> its Attention module
EXPERTS: dict[int, tuple[nn.Module, Callable[..., torch.Tensor]]] = {}  # w13 data_ptr -> (module, eager forward)
ORIGINAL = "_day0_eager_forward"  # attribute keeping a patched module's eager forward
KEY = "_day0_layer_key"  # a one-element tensor per attention layer: the op's handle on its layer


@torch.library.custom_op("day0::paged_attention", mutates_args=())
def paged_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_key: torch.Tensor) -> torch.Tensor:
    """The eager paged attention of the layer ``layer_key`` names, on the step's metadata: writes the new K/V
    into the paged cache (``index_copy_``) and attends. q: [T, H, D], k/v: [T, Hkv, D] -> [T, H * D]. The
    cache write is a side effect the graph does not see: nothing in the compiled region reads the cache, and
    the cache is no input of the graph (its pool size, set by the free memory at start, would change the
    graph's shapes and so its key in the FX graph cache)."""
    attn = ATTENTION[layer_key.data_ptr()]
    return getattr(attn, ORIGINAL)(q, k, v, STEP.meta)


@paged_attention.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_key: torch.Tensor) -> torch.Tensor:
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))


@torch.library.custom_op("day0::whole_attention", mutates_args=())
def whole_attention(hidden: torch.Tensor, layer_key: torch.Tensor) -> torch.Tensor:
    """A whole attention block run eager (MLA: its projections, latent cache write and attention in one
    forward) on the step's metadata. hidden: [T, hidden] -> [T, hidden]."""
    block = ATTENTION[layer_key.data_ptr()]
    return getattr(block, ORIGINAL)(hidden, STEP.meta)


@whole_attention.register_fake
def _(hidden: torch.Tensor, layer_key: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(hidden)


@torch.library.custom_op("day0::routed_experts", mutates_args=())
def routed_experts(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor) -> torch.Tensor:
    """The eager routed experts owning ``w13`` (their forward pre-hooks included: the expert-load counters).
    x: [T, H], weights/ids: [T, k] -> this rank's partial sum [T, H]."""
    _module, forward = EXPERTS[w13.data_ptr()]
    return forward(x, weights, ids)


@routed_experts.register_fake
def _(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, w13: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def patch_attention(attn: nn.Module, device: torch.device, *, whole: bool = False) -> None:
    """``attn`` becomes an opaque op under Dynamo: the paged ``Attention`` (q, k, v, meta), or with ``whole`` a
    whole attention block (hidden, meta), such as MLA's."""
    eager = attn.forward
    setattr(attn, ORIGINAL, eager)
    key = torch.zeros(1, device=device)  # same shape in every layer: the shared graph takes it as an input
    setattr(attn, KEY, key)
    ATTENTION[key.data_ptr()] = attn

    def forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, meta: Any) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return paged_attention(q, k, v, getattr(attn, KEY))
        return eager(q, k, v, meta)

    def forward_whole(hidden: torch.Tensor, meta: Any) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return whole_attention(hidden, getattr(attn, KEY))
        return eager(hidden, meta)

    attn.forward = forward_whole if whole else forward


HOOKS = "_day0_pre_hooks"  # the forward pre-hooks moved off a patched experts module


def patch_experts(experts: nn.Module) -> None:
    """Routed experts become the opaque op under Dynamo. Their forward pre-hooks (the expert-load counters,
    which take a lock) move into the forward itself, so Dynamo never traces them: they run in the op."""
    module_forward = experts.forward
    hooks = list(experts._forward_pre_hooks.items())
    experts._forward_pre_hooks.clear()
    setattr(experts, HOOKS, hooks)

    def eager(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        for _key, hook in hooks:
            hook(experts, (x, weights, ids))
        return module_forward(x, weights, ids)

    def forward(x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return routed_experts(x, weights, ids, experts.w13)
        return eager(x, weights, ids)

    setattr(experts, ORIGINAL, module_forward)
    EXPERTS[experts.w13.data_ptr()] = (experts, eager)
    experts.forward = forward
