"""Expert load of MoE models while serving: tokens routed to each expert of each MoE layer, counted by a
forward pre-hook on every experts module (one with ``num_experts``, called as ``(x, weights, ids)``)."""

from __future__ import annotations

import threading
from typing import Any

import torch
from torch import nn


class ExpertLoad:
    """Counts per layer and expert; ``counts()`` is a snapshot safe to read from another thread."""

    def __init__(self, model: Any) -> None:
        self._lock = threading.Lock()
        self._counts: list[torch.Tensor] = []
        modules = model.modules() if isinstance(model, nn.Module) else []
        for module in modules:
            num = getattr(module, "num_experts", None)
            if isinstance(num, int) and num > 1 and type(module).__name__.endswith("Experts"):
                self._counts.append(torch.zeros(num, dtype=torch.int64))
                module.register_forward_pre_hook(self._hook(len(self._counts) - 1))

    @property
    def active(self) -> bool:
        return bool(self._counts)

    def _hook(self, layer: int) -> Any:
        def count(module: nn.Module, args: tuple) -> None:
            if len(args) == 3 and isinstance(args[2], torch.Tensor):
                ids = args[2].flatten().to("cpu", torch.int64)  # ids: [T * k]
                with self._lock:
                    self._counts[layer] += torch.bincount(ids, minlength=self._counts[layer].numel())

        return count

    def counts(self) -> list[list[int]]:
        with self._lock:
            return [c.tolist() for c in self._counts]
