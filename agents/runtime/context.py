"""Per-step forward metadata shared by the engine (producer) and the attention layers (consumers).

One ``ForwardContext`` describes a flattened batch of ``T`` tokens that belong to ``B`` sequences. It covers
three cases with one layout:

* no cache (reference / alignment / whole-prompt scoring): ``block_tables`` is None; each sequence attends
  causally over its own ``q_len`` tokens; ``seqlens_k == seqlens_q``;
* paged prefill, possibly chunked (a sequence may already have ``seqlens_k - seqlens_q`` tokens cached):
  the new K/V are written to ``slot_mapping`` then each query attends to ``seqlens_k`` cached tokens,
  causally offset by the cached prefix;
* paged decode: every ``q_len == 1``.

Cache layout (allocated by the engine, bound with ``RuntimeModel.bind_kv_cache``): for standard attention,
``k_cache`` and ``v_cache`` per layer are ``[num_blocks, block_size, num_kv_heads_local, head_dim]``; for MLA
the single latent cache per layer is ``[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]``. A slot is
``block_id * block_size + offset``; slot ``-1`` means "do not store" (padding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardContext:
    """Where each token of a flattened batch sits and where its K/V goes."""

    cu_seqlens_q: torch.Tensor  # [B + 1] int32, prefix sums of per-sequence new-token counts
    seqlens_k: torch.Tensor  # [B] int32, tokens each sequence attends to after this step (cached + new)
    max_seqlen_q: int
    max_seqlen_k: int
    slot_mapping: torch.Tensor | None = None  # [T] int64 cache slots of the new tokens; None: no cache
    block_tables: torch.Tensor | None = None  # [B, max_blocks] int32, -1 padded; None: no cache
    is_decode: bool = False  # every sequence contributes exactly one new token
    # [N] int64, ascending: the only rows whose final hidden states the caller reads (each sampling sequence's
    # last token). A model may then run its last layer's output projection and MLP on these rows alone and
    # return just them (``ForwardOutput.rows``); the layer's keys and values are still cached for every row.
    sample_rows: torch.Tensor | None = None

    @property
    def num_seqs(self) -> int:
        return int(self.seqlens_k.shape[0])

    @property
    def uses_cache(self) -> bool:
        return self.block_tables is not None

    @classmethod
    def for_prompts(cls, lengths: list[int], device: torch.device | str = "cpu") -> ForwardContext:
        """A no-cache context for whole prompts of the given lengths, concatenated in order."""
        lens = torch.tensor(lengths, dtype=torch.int32, device=device)
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int32, device=device)
        cu[1:] = torch.cumsum(lens, 0)
        longest = max(lengths) if lengths else 0
        return cls(cu_seqlens_q=cu, seqlens_k=lens, max_seqlen_q=longest, max_seqlen_k=longest)
