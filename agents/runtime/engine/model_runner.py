"""Runs one scheduled step on the model: sizes and binds the paged KV cache, builds the step's
``ForwardContext`` once, runs the forward pass and computes logits only for each sequence's last token."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch

from agents.runtime.context import ForwardContext
from agents.runtime.engine.block_manager import BlockManager
from agents.runtime.engine.scheduler import ScheduledBatch
from agents.runtime.engine.sequence import Sequence
from agents.runtime.interface import KVCacheSpec, RuntimeModel

log = logging.getLogger(__name__)


def available_memory_bytes(device: torch.device) -> int:
    """Free memory on ``device`` now (after the weights were loaded)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("cannot read MemAvailable from /proc/meminfo")


def size_kv_pool(
    spec: KVCacheSpec,
    device: torch.device,
    block_size: int,
    *,
    memory_fraction: float,
    max_tokens: int,
) -> int:
    """Blocks that fit in ``memory_fraction`` of the free memory, capped at ``max_tokens`` tokens of need."""
    block_bytes = spec.bytes_per_token() * block_size
    by_memory = int(available_memory_bytes(device) * memory_fraction) // block_bytes
    by_need = -(-max_tokens // block_size)
    return max(1, min(by_memory, by_need))


class ModelRunner:
    """Owns the KV-cache tensors. ``paged`` False: the model has no cache spec and every step recomputes each
    scheduled sequence from its first token (the transformers fallback)."""

    def __init__(self, model: RuntimeModel, device: torch.device | str, block_size: int, num_blocks: int) -> None:
        self.model = model
        self.device = torch.device(device)
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.spec = model.kv_cache_spec()
        self.paged = self.spec is not None
        self.kv_cache_bytes = 0
        self.broadcast: Callable[[dict[str, Any] | None], None] | None = None
        if self.paged:
            self._allocate()

    def _allocate(self) -> None:
        spec = self.spec
        caches: list[tuple[torch.Tensor, ...]] = []
        for _ in range(spec.num_layers):
            if spec.kind == "mla":
                shape = (self.num_blocks, self.block_size, spec.latent_dim)
                caches.append((torch.zeros(shape, dtype=spec.dtype, device=self.device),))
            else:
                shape = (self.num_blocks, self.block_size, spec.num_kv_heads, spec.head_dim)
                k = torch.zeros(shape, dtype=spec.dtype, device=self.device)
                caches.append((k, torch.zeros_like(k)))
        self.kv_cache_bytes = spec.bytes_per_token() * self.block_size * self.num_blocks
        self.model.bind_kv_cache(caches)
        log.info(
            "KV cache: %d blocks x %d tokens, %.1f MiB", self.num_blocks, self.block_size, self.kv_cache_bytes / 2**20
        )

    def run(self, batch: ScheduledBatch, blocks: BlockManager) -> tuple[list[Sequence], torch.Tensor | None]:
        """Forward the batch; return the sequences that reach their end this step and their logits [N, V]."""
        ends = [
            s.num_computed_tokens + n == s.num_tokens for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
        ]
        inputs = self.prepare(batch, ends)
        if self.broadcast is not None:  # tensor parallel: every rank runs the same step
            self.broadcast(inputs)
        return [s for s, end in zip(batch.seqs, ends, strict=True) if end], self.execute(inputs)

    def prepare(self, batch: ScheduledBatch, ends: list[bool]) -> dict[str, Any]:
        """The step's inputs as plain lists (cheap to send to other ranks)."""
        if not self.paged:  # recompute: whole sequences of those that sample this step
            seqs = [s for s, end in zip(batch.seqs, ends, strict=True) if end]
            lengths = [s.num_tokens for s in seqs]
            return {"ids": [t for s in seqs for t in s.token_ids], "lengths": lengths}
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        seqlens_k: list[int] = []
        bs = self.block_size
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start = seq.num_computed_tokens
            ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            cu.append(cu[-1] + n)
            seqlens_k.append(start + n)
        width = max(len(s.block_table) for s in batch.seqs)
        tables = [s.block_table + [-1] * (width - len(s.block_table)) for s in batch.seqs]
        last = [cu[i + 1] - 1 for i, end in enumerate(ends) if end]
        return {
            "ids": ids,
            "positions": positions,
            "slots": slots,
            "cu": cu,
            "seqlens_k": seqlens_k,
            "tables": tables,
            "last": last,
            "max_q": max(batch.num_new_tokens),
            "is_decode": batch.is_decode,
        }

    @torch.inference_mode()
    def execute(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        """Run the model on prepared inputs; logits [N, V] of the rows that sample, None when none does."""
        dev = self.device
        if not self.paged:
            return self._execute_recompute(inputs)
        ctx = ForwardContext(
            cu_seqlens_q=torch.tensor(inputs["cu"], dtype=torch.int32, device=dev),  # [B + 1]
            seqlens_k=torch.tensor(inputs["seqlens_k"], dtype=torch.int32, device=dev),  # [B]
            max_seqlen_q=inputs["max_q"],
            max_seqlen_k=max(inputs["seqlens_k"]),
            slot_mapping=torch.tensor(inputs["slots"], dtype=torch.int64, device=dev),  # [T]
            block_tables=torch.tensor(inputs["tables"], dtype=torch.int32, device=dev),  # [B, max_blocks]
            is_decode=inputs["is_decode"],
        )
        input_ids = torch.tensor(inputs["ids"], dtype=torch.int64, device=dev)  # [T]
        pos = torch.tensor(inputs["positions"], dtype=torch.int64, device=dev)  # [T]
        hidden = self.model.forward(input_ids, pos, ctx).hidden  # hidden: [T, D]
        if not inputs["last"]:
            return None
        rows = hidden.index_select(0, torch.tensor(inputs["last"], device=dev))  # rows: [N, D]
        return self.model.compute_logits(rows)

    def _execute_recompute(self, inputs: dict[str, Any]) -> torch.Tensor | None:
        lengths = inputs["lengths"]
        if not lengths:
            return None
        positions = [p for n in lengths for p in range(n)]
        ctx = ForwardContext.for_prompts(lengths, device=self.device)
        input_ids = torch.tensor(inputs["ids"], dtype=torch.int64, device=self.device)  # [T]
        pos = torch.tensor(positions, dtype=torch.int64, device=self.device)  # [T]
        hidden = self.model.forward(input_ids, pos, ctx).hidden  # hidden: [T, D]
        last = (ctx.cu_seqlens_q[1:] - 1).long()  # last: [B]
        return self.model.compute_logits(hidden.index_select(0, last))
