"""Expert load of MoE models while serving: tokens routed to each expert of each MoE layer, counted by a
forward pre-hook on every experts module (one with ``num_experts``, called as ``(x, weights, ids)``).

They count the tokens each expert computed: in a prefill step the last MoE layer routes only the rows that
sample (``ForwardContext.sample_rows``; the others skip that layer's MLP), so over a request it counts one
token per generated token, where the earlier layers count every token fed.

The counts live on the device the ids are on and grow by an ``index_add_`` per layer and step: no host
synchronisation on the serving path. They reach the host only when read (``/stats/experts``, a benchmark)."""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn


class ExpertLoad:
    """Counts per layer and expert; ``counts()`` is a snapshot safe to read from another thread."""

    def __init__(self, model: Any) -> None:
        self._lock = threading.Lock()
        self._sizes: list[int] = []
        self._counts: list[torch.Tensor | None] = []
        self.ep_size = 1
        modules = model.modules() if isinstance(model, nn.Module) else []
        for module in modules:
            num = getattr(module, "num_experts", None)
            if isinstance(num, int) and num > 1 and type(module).__name__.endswith("Experts"):
                local = getattr(module, "num_local", num)
                self.ep_size = max(self.ep_size, num // local if isinstance(local, int) and local > 0 else 1)
                self._sizes.append(num)
                self._counts.append(None)  # allocated on the device of the first ids seen
                module.register_forward_pre_hook(self._hook(len(self._counts) - 1))

    @property
    def active(self) -> bool:
        return bool(self._counts)

    def _hook(self, layer: int) -> Any:
        def count(module: nn.Module, args: tuple) -> None:
            if len(args) == 3 and isinstance(args[2], torch.Tensor):
                ids = args[2].flatten()  # ids: [T * k]
                with self._lock:
                    counts = self._counts[layer]
                    if counts is None or counts.device != ids.device:
                        counts = torch.zeros(self._sizes[layer], dtype=torch.int64, device=ids.device)
                        self._counts[layer] = counts
                    counts.index_add_(0, ids.to(torch.int64), torch.ones_like(ids, dtype=torch.int64))

        return count

    def counts(self) -> list[list[int]]:
        """Tokens per expert of every MoE layer (the host copy happens here, on read)."""
        with self._lock:
            return [[0] * n if c is None else c.tolist() for n, c in zip(self._sizes, self._counts, strict=True)]
