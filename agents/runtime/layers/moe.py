"""Mixture of experts: a router returning (topk_weights [T, k], topk_ids [T, k]), stacked expert weights
(``w13: [E_local, 2I, H]``, ``w2: [E_local, H, I]``) partitioned over EP ranks (or split on I over TP ranks
when EP is 1), optional shared experts, and one ``all_reduce`` to combine partial sums."""

from __future__ import annotations

from collections.abc import Callable, Hashable

import torch
import torch.nn.functional as F
from torch import nn

from agents.runtime import kernels
from agents.runtime.distributed import all_reduce, get_parallel_state
from agents.runtime.layers.linear import pack_layout, replace_packed
from agents.runtime.layers.mlp import silu_and_mul
from agents.runtime.layers.weights import bind_loader, check_shape, make_param, quantizable, replicated, split


class TopKRouter(nn.Module):
    """Softmax over expert logits, then top-k, optionally renormalised (Mixtral, Qwen3-MoE)."""

    def __init__(self, hidden: int, num_experts: int, top_k: int, renormalize: bool) -> None:
        super().__init__()
        self.top_k, self.renormalize = top_k, renormalize
        self.weight = replicated(make_param((num_experts, hidden)))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x, self.weight)  # logits: [T, E]
        if self.renormalize:  # softmax over all experts then renormalising the top-k = softmax over the top-k
            top, ids = torch.topk(logits, self.top_k, dim=-1)  # [T, k] each
            return torch.softmax(top, dim=-1, dtype=torch.float32), ids
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        return torch.topk(probs, self.top_k, dim=-1)  # (weights, ids): [T, k] each


class RoutedExperts(nn.Module):
    """Routed SwiGLU experts, their weights stacked per expert (w1 and w3 packed). The forward sorts the
    (token, expert) pairs by expert once and runs two grouped GEMMs (``torch.nn.functional.grouped_mm``) over
    the rows of each local expert: no Python loop over experts and no host read of the routing, so a batch
    of one reads only its k experts' weights and a step stays capturable. Checkpoint shard ids are
    ``(expert_id, "w1"|"w3"|"w2")``.

    On a CPU with every expert local (whole, or this rank's TP slice of the intermediate size) (fp32, not traced), reading the routing waits for nothing, and
    two faster paths take over: ``fused_cpu`` runs the native kernel (``kernels.moe_experts``: each expert's
    weights read once, in their own layout, for all of its rows; gate, up, SiLU, down and the weighted sum in
    one call) while the experts average at most ``FUSED_MAX_ROWS`` rows (decode and prefill chunks: torch's
    CPU grouped GEMM is a per-group loop over unpacked weights, 2-3x slower at decode); without the kernel,
    one token takes ``_one_token_cpu`` (``one_token_cpu``).

    ``pack_panels`` (``pack_weights`` on a CPU, fp32, every expert local (whole, or this rank's TP slice of the intermediate size)) re-lays both stacks, in place
    of the originals, as the native kernels' panels (``kernels.pack_expert_panels``); ``kernels.moe_panels`` then
    computes every row count (decode and whole prefills) with each token's result independent of its batch, and
    the paths that read the stacked layout (a tracer, inputs the kernel does not cover) get it back per call.
    ``load_as_panels`` makes the empty panels before loading instead, and each checkpoint shard is packed straight
    into them (``direct_fill``); stacked, a whole shard is read straight into its rows (``direct_target``; both
    run by ``loader/direct.py``)."""

    one_token_cpu = True
    fused_cpu = True
    FUSED_MAX_ROWS = 128  # average rows per expert up to which the kernel beats the grouped GEMMs (8 experts,
    # H 768, I 512, 2 threads, 100M Qwen3-MoE in the engine: a 512-token prefill chunk 246 -> 202 ms, 16-token
    # decode 2.6-3.1x faster a layer)

    def __init__(self, num_experts: int, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.num_experts = num_experts
        state = get_parallel_state()  # experts in ep blocks of the stage, each expert split over its block
        self.tp_size, self.tp_rank = state.expert_tp_size, state.expert_tp_rank
        self.num_local = split(num_experts, state.ep_size, "num_experts")
        self.first = state.ep_rank * self.num_local
        self.inter = intermediate
        self.inter_local = split(intermediate, self.tp_size, "expert intermediate size")
        ids = range(num_experts)
        self.w13 = quantizable(bind_loader(make_param((self.num_local, 2 * self.inter_local, hidden)), self._load,
                                           [(e, w) for e in ids for w in ("w1", "w3")], self._shape))
        self.w2 = quantizable(bind_loader(make_param((self.num_local, hidden, self.inter_local)), self._load,
                                          [(e, "w2") for e in ids], self._shape))
        self.w13.direct_target = self.w2.direct_target = self._target
        self.w13.direct_fill = self.w2.direct_fill = self._fill
        self.hidden = hidden
        self.panels = False  # w13/w2 hold kernels.pack_expert_panels' layout (pack_panels)
        self._group_ids: torch.Tensor | None = None  # [E_local] 0..E_local-1 on the weights' device

    def _shape(self, shard_id: Hashable) -> tuple[int, int]:
        return (self.hidden, self.inter) if shard_id[1] == "w2" else (self.inter, self.hidden)

    def _load(self, param: nn.Parameter, loaded: torch.Tensor, shard_id: Hashable = None) -> None:
        expert, which = shard_id
        check_shape(loaded, self._shape(shard_id))
        local = expert - self.first
        if not 0 <= local < self.num_local:
            return  # another EP rank holds this expert
        n, start = self.inter_local, self.tp_rank * self.inter_local
        if self.panels:  # load_as_panels: the shard packed straight into this expert's panels
            self._pack_shard(param.data[local], loaded, which, start, n)
        elif which == "w2":
            param.data[local].copy_(loaded.narrow(1, start, n))
        else:
            param.data[local].narrow(0, 0 if which == "w1" else n, n).copy_(loaded.narrow(0, start, n))

    def _target(self, param: nn.Parameter, shard_id: Hashable) -> torch.Tensor | None:
        """Where a whole expert shard goes unchanged (``loader/direct.py`` reads it straight there): w1 and w3
        into the gate and up rows of ``w13[e]``, w2 into ``w2[e]``; None for another rank's expert, a TP slice, or
        panels."""
        expert, which = shard_id
        local = expert - self.first
        if self.tp_size != 1 or self.panels or not 0 <= local < self.num_local:
            return None
        if which == "w2":
            return param.data[local]
        return param.data[local].narrow(0, 0 if which == "w1" else self.inter, self.inter)

    def _fill(self, param: nn.Parameter, shard_id: Hashable) -> Callable[[torch.Tensor], None] | None:
        """With panels (``load_as_panels``): the function that packs one checkpoint shard into its expert's panels
        (``loader/direct.py`` runs it on the mapped tensor, beside the other shards); None otherwise."""
        if not self.panels or not 0 <= shard_id[0] - self.first < self.num_local:
            return None
        return lambda loaded: self._load(param, loaded, shard_id)

    def _pack_shard(self, dest: torch.Tensor, loaded: torch.Tensor, which: str, start: int, n: int) -> None:
        """This rank's slice of one checkpoint shard into one expert's panels ``dest`` (w13: ``[2 GP, H, 16]``, w1
        into the first GP panels and w3 into the rest; w2: ``[HP, I, 16]``), as ``pack_expert_panels`` lays them."""
        src = loaded.narrow(1, start, n) if which == "w2" else loaded.narrow(0, start, n)
        if src.dtype != torch.float32 or src.stride(-1) != 1:
            src = src.to(torch.float32).contiguous()
        gp = dest.shape[0] // 2
        if which != "w2":
            dest = dest[:gp] if which == "w1" else dest[gp:]
        if not kernels.pack_panels_into(dest, src):
            raise RuntimeError(f"expert shard {which} {tuple(src.shape)} cannot be packed into panels "
                               f"{tuple(dest.shape)}")

    def _groups(self, device: torch.device) -> torch.Tensor:
        ids = self._group_ids
        if ids is None or ids.device != device:
            ids = self._group_ids = torch.arange(self.num_local, dtype=torch.int64, device=device)
        return ids

    def _panels_apply(self) -> bool:
        """Whether the stacks may become panels (not yet panels, every expert local, fp32 CPU weights, the panel
        layout chosen): ``pack_panels`` and ``load_as_panels`` alike."""
        w13 = self.w13
        return (not self.panels and self.num_local == self.num_experts and w13.dtype == torch.float32
                and w13.device.type == "cpu" and pack_layout() == "panels")

    def load_as_panels(self) -> bool:
        """Before loading: w13 and w2 become empty panels (``pack_panels``' layout, same conditions) that ``_load``
        packs each checkpoint shard straight into: one copy from the checkpoint, no stacked tensor allocated,
        filled and packed again. True when switched."""
        w13, w2 = self.w13, self.w2
        if not self._panels_apply() or not kernels.ok(w13, w2):
            return False
        shapes = kernels.expert_panel_shapes(self.num_local, self.inter_local, self.hidden)
        for name, old, shape in zip(("w13", "w2"), (w13, w2), shapes, strict=True):
            new = make_param(shape)
            replace_packed(self, name, new, old.shape[1])
            new.loads_panels = True  # packed, and takes checkpoint shards until the load ends (``_load``)
        self.panels = True
        return True

    def pack_panels(self) -> bool:
        """Re-lay w13 and w2 as panels (see the class), freeing the stacked originals; True when packed. Only where
        the native kernels run (fp32 CPU weights, every expert local (whole, or this rank's TP slice of the intermediate size), the panel layout chosen)."""
        w13, w2 = self.w13, self.w2
        if not self._panels_apply():
            return False
        with torch.inference_mode(False), torch.no_grad():
            packed = kernels.pack_expert_panels(w13.data.contiguous(), w2.data.contiguous())
        if packed is None:
            return False
        for name, old, new in (("w13", w13, packed[0]), ("w2", w2, packed[1])):
            replace_packed(self, name, nn.Parameter(new, requires_grad=False), old.shape[1])
        self.panels = True
        return True

    def _stacked(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(w13 [E, 2I, H], w2 [E, H, I]): the parameters, or rebuilt from their panels (a new copy per call)."""
        if self.panels:
            return kernels.unpack_expert_panels(self.w13, self.w2, self.inter_local)
        return self.w13, self.w2

    def _one_token_cpu(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """One token on the CPU, every expert local: its k experts as plain matrix-vector products, added in
        expert order like the grouped path (reading the routing costs nothing on a CPU; the grouped fallback's
        sort, search and per-group dispatch cost 0.9 ms a step over 5 layers of the 100M Qwen3-MoE)."""
        pairs = sorted(zip(ids[0].tolist(), weights[0].tolist(), strict=True))
        out = torch.zeros_like(x)
        w13, w2 = self._stacked()
        for expert, weight in pairs:
            h = F.linear(x, w13[expert])  # h: [1, 2I]
            out += F.linear(silu_and_mul(h), w2[expert]) * weight  # [1, H]
        return out

    def forward(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """x: [T, H], weights/ids: [T, k] -> this rank's partial sum [T, H]."""
        if (x.is_cpu and self.num_local == self.num_experts and self.w13.dtype == x.dtype
                and not torch.compiler.is_compiling()
                and not torch._C._len_torch_dispatch_stack()):  # a tracer (the operator inventory) sees the grouped ops
            if self.panels:
                out = kernels.moe_panels(x.contiguous(), self.w13, self.w2, self.inter_local, ids.contiguous(),
                                         weights.contiguous())
                if out is not None:
                    return out
            elif self.fused_cpu and ids.numel() <= self.FUSED_MAX_ROWS * self.num_experts:
                out = kernels.moe_experts(x.contiguous(), self.w13, self.w2, ids.contiguous(), weights.contiguous())
                if out is not None:
                    return out
            if self.one_token_cpu and x.shape[0] == 1:
                return self._one_token_cpu(x, weights, ids)
        top_k = ids.shape[1]
        keys = ids.flatten()  # [T * k] expert of each (token, choice) pair
        remote = None
        if self.num_local != self.num_experts:  # another EP rank's experts sort past the last local group
            keys = keys - self.first
            remote = (keys < 0) | (keys >= self.num_local)  # [T * k]
            keys = keys.masked_fill(remote, self.num_local)
        keys, order = torch.sort(keys, stable=True)  # stable: each expert's rows in token order, like a loop
        # ends[e]: one past the last sorted row of local expert e (rows past ends[-1] are other ranks')
        ends = torch.searchsorted(keys, self._groups(keys.device), right=True).to(torch.int32)  # [E_local]
        tok = order // top_k  # [T * k] token of each sorted row
        w13, w2 = self._stacked()
        h = F.grouped_mm(x.index_select(0, tok), w13.transpose(1, 2), offs=ends)  # h: [T * k, 2I]
        y = F.grouped_mm(silu_and_mul(h), w2.transpose(1, 2), offs=ends)  # y: [T * k, H]
        y = y * weights.flatten().index_select(0, order)[:, None]
        if remote is not None:  # their rows were never computed (uninitialised): exactly zero instead
            y = y.masked_fill(remote.index_select(0, order)[:, None], 0.0)
        # per token, its experts' terms are added in expert order, as the reference's loop over experts does
        return torch.zeros_like(x).index_add_(0, tok, y.to(x.dtype))  # [T, H]


class MoEBlock(nn.Module):
    """``gate`` routes, ``experts`` compute; one ``all_reduce`` over the pipeline stage sums the ranks' expert
    partials. Shared experts (built with ``reduce_results=False``) are added before it when TP-sharded, by the
    first of the stage's TP groups only (the others hold the same shards), and after it when replicated."""

    def __init__(self, gate: nn.Module, experts: RoutedExperts, shared_experts: nn.Module | None = None,
                 shared_gate: nn.Module | None = None) -> None:
        super().__init__()
        self.gate = gate
        self.experts = experts
        self.shared_experts = shared_experts
        self.shared_expert_gate = shared_gate
        state = get_parallel_state()
        self.tp_size = state.tp_size
        self.adds_shared = state.attention_replica == 0

    def _shared(self, x: torch.Tensor) -> torch.Tensor:
        y = self.shared_experts(x)  # y: [T, H]
        if self.shared_expert_gate is not None:
            y = torch.sigmoid(self.shared_expert_gate(x)) * y
        return y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        out = self.experts(x, weights, ids)  # out: [T, H] partial
        if self.shared_experts is not None and self.tp_size > 1 and self.adds_shared:
            out += self._shared(x)
        out = all_reduce(out, group="stage")
        if self.shared_experts is not None and self.tp_size == 1:
            out += self._shared(x)
        return out
