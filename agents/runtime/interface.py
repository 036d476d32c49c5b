"""The contract every runtime model honours, native or fallback, so the engine, the loader and the pipeline
never branch on the model family."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from agents.runtime.context import ForwardContext


@dataclass(frozen=True)
class KVCacheSpec:
    """What one layer caches per token. ``kind="kv"``: K and V of ``num_kv_heads`` × ``head_dim`` each (local
    to this TP rank). ``kind="mla"``: one latent vector of ``latent_dim`` (kv_lora_rank + qk_rope_head_dim)."""

    kind: str  # "kv" | "mla"
    num_layers: int
    num_kv_heads: int = 0
    head_dim: int = 0
    latent_dim: int = 0
    dtype: torch.dtype = torch.float32

    def bytes_per_token(self) -> int:
        elem = torch.empty((), dtype=self.dtype).element_size()
        per_layer = 2 * self.num_kv_heads * self.head_dim if self.kind == "kv" else self.latent_dim
        return self.num_layers * per_layer * elem


@dataclass
class ForwardOutput:
    hidden: torch.Tensor  # [T, hidden] final hidden states (after the final norm)
    layer_hidden: list[torch.Tensor] | None = None  # per block output [T, hidden], when asked
    # set when the model honoured ``ctx.sample_rows``: ``hidden`` is then [N, hidden], those rows only
    rows: torch.Tensor | None = None


@runtime_checkable
class RuntimeModel(Protocol):
    """A model the engine can drive. ``path`` is "native" or "fallback"."""

    path: str

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64, sequences concatenated
        positions: torch.Tensor,  # [T] int64, position of each token in its sequence
        ctx: ForwardContext,
        output_hidden_states: bool = False,
    ) -> ForwardOutput: ...

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:  # [N, hidden] -> [N, vocab] (full vocab)
        ...

    def kv_cache_spec(self) -> KVCacheSpec | None:
        """None: the model cannot use the paged cache (the engine then recomputes the whole sequence)."""
        ...

    def bind_kv_cache(self, caches: list[tuple[torch.Tensor, ...]]) -> None:
        """One tuple per layer: (k_cache, v_cache) for "kv", (latent_cache,) for "mla"."""
        ...
