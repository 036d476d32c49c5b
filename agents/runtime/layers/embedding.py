"""Vocabulary-parallel embedding and LM head: each TP rank holds a contiguous slice of the (padded) vocab."""

from __future__ import annotations

from collections.abc import Hashable

import torch
import torch.nn.functional as F
from torch import nn

from agents.runtime import kernels
from agents.runtime.distributed import all_gather, all_reduce, get_tp_rank, get_tp_world_size
from agents.runtime.layers.linear import dense_linear
from agents.runtime.layers.weights import adopt_or_copy, bind_loader, check_shape, make_param


def embedding_rows(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``F.embedding(ids, weight)`` for a plain ``[V, hidden]`` table or one packed as panels (a tied LM head packed
    by ``pack_weight``: ``[ceil(V / 16), hidden, 16]``, row v at ``[v // 16, :, v % 16]``), so the table and the
    head share one copy. An id outside the table is refused, as ``F.embedding`` refuses it."""
    rows = getattr(weight, "panel_rows", 0)
    if not rows:
        return F.embedding(ids, weight)
    lo, hi = torch.aminmax(ids) if ids.numel() else (0, 0)  # one pass over the ids a step, not two
    if int(lo) < 0 or int(hi) >= rows:
        raise IndexError(f"token id out of the embedding table's range [0, {rows})")
    return weight[ids // kernels.PANEL, :, ids % kernels.PANEL]  # [*ids.shape, hidden]


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int) -> None:
        super().__init__()
        self.tp_rank, self.tp_size = get_tp_rank(), get_tp_world_size()
        self.vocab_size = vocab_size
        self.vocab_local = -(-vocab_size // self.tp_size)  # padded so every rank holds the same count
        self.vocab_start = self.tp_rank * self.vocab_local
        full = (vocab_size, hidden)

        def load(p: nn.Parameter, loaded: torch.Tensor, shard_id: Hashable = None) -> None:
            check_shape(loaded, full)
            if self.tp_size == 1:
                adopt_or_copy(p, loaded)
                return
            rows = max(0, min(self.vocab_local, vocab_size - self.vocab_start))
            p.data[:rows].copy_(loaded.narrow(0, self.vocab_start, rows))
            p.data[rows:].zero_()

        self.weight = bind_loader(make_param((self.vocab_local, hidden)), load, [None], lambda _s: full)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return embedding_rows(input_ids, self.weight)  # [T, hidden]
        local = input_ids - self.vocab_start
        outside = (local < 0) | (local >= self.vocab_local)
        out = embedding_rows(local.masked_fill(outside, 0), self.weight)  # out: [T, hidden]
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return all_reduce(out)


class ParallelLMHead(VocabParallelEmbedding):
    """Logits over this rank's vocab slice, gathered to the full vocab in ``compute_logits``."""

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = dense_linear(hidden, self.weight)  # logits: [N, vocab_local]
        if self.tp_size > 1:
            logits = all_gather(logits, dim=-1)  # [N, vocab_local * tp]
        return logits if logits.shape[-1] == self.vocab_size else logits[..., : self.vocab_size]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.compute_logits(hidden)
