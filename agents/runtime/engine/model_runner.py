"""Runs one scheduled step on the model: sizes and binds the paged KV cache, builds the step's
``ForwardContext`` once, runs the forward pass and computes logits only for each sequence's last token."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from agents.runtime.context import ForwardContext
from agents.runtime.distributed import COMM_TIMER
from agents.runtime.engine.block_manager import BlockManager
from agents.runtime.engine.logprobs import ROW_CHUNK, token_logprobs
from agents.runtime.engine.outputs import TokenLogprob
from agents.runtime.engine.scheduler import ScheduledBatch
from agents.runtime.engine.sequence import Sequence
from agents.runtime.interface import KVCacheSpec, RuntimeModel

log = logging.getLogger(__name__)


@dataclass
class StepResult:
    """One forward pass: the sequences that sample and their logits [N, V]; per sequence that asked, the
    logprobs of the prompt tokens this step scored, in position order."""

    seqs: list[Sequence]
    logits: torch.Tensor | None
    prompt_logprobs: list[tuple[Sequence, list[TokenLogprob]]] = field(default_factory=list)


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
        step = self.run_step(batch)
        return step.seqs, step.logits

    def run_step(self, batch: ScheduledBatch) -> StepResult:
        """Forward the batch: the logits of the sequences that reach their end, and the prompt logprobs this
        step's chunks contribute for the sequences that asked for them."""
        ends = [
            s.num_computed_tokens + n == s.num_tokens for s, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
        ]
        inputs = self.prepare(batch, ends)
        plan = self._prompt_logprob_plan(batch, ends, inputs)
        if self.broadcast is not None:  # tensor parallel: every rank runs the same step
            self.broadcast(inputs)
        logits, prompt = self.execute(inputs)
        seqs = [s for s, end in zip(batch.seqs, ends, strict=True) if end]
        return StepResult(seqs, logits, [(seq, prompt[lo:hi]) for seq, lo, hi in plan])

    def _prompt_logprob_plan(
        self, batch: ScheduledBatch, ends: list[bool], inputs: dict[str, Any]
    ) -> list[tuple[Sequence, int, int]]:
        """Add the rows whose logits score a prompt token (``prompt_rows``, ``prompt_targets``, ``prompt_top``)
        to ``inputs``; return, per sequence, its slice of them. A position already scored (before a preemption)
        is not scored again."""
        rows: list[int] = []
        targets: list[int] = []
        top: list[int] = []
        plan: list[tuple[Sequence, int, int]] = []
        offset = 0  # first row of the sequence in the step's hidden states
        for seq, n, end in zip(batch.seqs, batch.num_new_tokens, ends, strict=True):
            start = seq.num_computed_tokens if self.paged else 0
            length = n if self.paged else seq.num_tokens
            if not self.paged and not end:
                continue  # the recompute path forwards only the sequences that sample
            if seq.prompt_logprobs is not None:
                first = max(start, len(seq.prompt_logprobs) - 1)  # row p scores token p + 1
                last = min(start + length, seq.num_prompt_tokens - 1)
                if first < last:
                    plan.append((seq, len(rows), len(rows) + last - first))
                    rows.extend(offset + p - start for p in range(first, last))
                    targets.extend(seq.token_ids[p + 1] for p in range(first, last))
                    top.extend([seq.params.prompt_logprobs] * (last - first))
            offset += length
        if rows:
            inputs.update(prompt_rows=rows, prompt_targets=targets, prompt_top=top)
        return plan

    def prepare(self, batch: ScheduledBatch, ends: list[bool]) -> dict[str, Any]:
        """The step's inputs as plain lists (cheap to send to other ranks)."""
        if not self.paged:  # recompute: whole sequences of those that sample this step
            seqs = [s for s, end in zip(batch.seqs, ends, strict=True) if end]
            lengths = [s.num_tokens for s in seqs]
            images = [s.images for s in seqs]  # the model encodes each request's images once and keeps them
            return {"ids": [t for s in seqs for t in s.token_ids], "lengths": lengths,
                    **({"images": images} if any(i is not None for i in images) else {})}
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        cu = [0]
        seqlens_k: list[int] = []
        bs = self.block_size
        embed_rows: list[int] = []
        embeds: list[torch.Tensor] = []
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            start = seq.num_computed_tokens
            # image features in place of this chunk's placeholder tokens: the first pipeline stage's embeddings
            # (a later stage takes the previous stage's hidden states and holds no vision tower)
            if seq.images is not None and getattr(self.model, "is_first", True):
                offsets, rows = seq.images.chunk_rows(start, n)
                if rows:
                    features = seq.images.encoded(self.model.encode_images)
                    embed_rows.extend(cu[-1] + o for o in offsets)
                    embeds.append(features[rows[0] : rows[-1] + 1])
            ids.extend(seq.token_ids[start : start + n])
            positions.extend(range(start, start + n))
            table = seq.block_table
            slots.extend(table[p // bs] * bs + p % bs for p in range(start, start + n))
            cu.append(cu[-1] + n)
            seqlens_k.append(start + n)
        width = max(len(s.block_table) for s in batch.seqs)
        tables = [s.block_table + [-1] * (width - len(s.block_table)) for s in batch.seqs]
        last = [cu[i + 1] - 1 for i, end in enumerate(ends) if end]
        extra: dict[str, Any] = {"embed_rows": embed_rows, "embeds": torch.cat(embeds)} if embeds else {}
        return {
            **extra,
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
    @COMM_TIMER.step
    def execute(self, inputs: dict[str, Any]) -> tuple[torch.Tensor | None, list[TokenLogprob]]:
        """Run the model on prepared inputs: logits [N, V] of the rows that sample (None when none does) and
        the logprobs of the prompt tokens in ``prompt_rows`` (every rank computes both: the LM head of a
        tensor-parallel model gathers across ranks)."""
        dev = self.device
        if not self.paged:
            hidden, sampled = self._forward_recompute(inputs)
        else:
            hidden, sampled = self._forward_paged(inputs)
        prompt: list[TokenLogprob] = []
        if inputs.get("prompt_rows"):
            rows = torch.tensor(inputs["prompt_rows"], dtype=torch.long, device=dev)  # rows: [P]
            for lo in range(0, rows.numel(), ROW_CHUNK):  # bounded fp32 logits: at most ROW_CHUNK x V at once
                chunk = self.model.compute_logits(hidden.index_select(0, rows[lo : lo + ROW_CHUNK]))
                hi = lo + chunk.shape[0]
                prompt += token_logprobs(chunk, inputs["prompt_targets"][lo:hi], inputs["prompt_top"][lo:hi])
        if sampled is None:
            return None, prompt
        return self.model.compute_logits(sampled), prompt

    def _forward_paged(self, inputs: dict[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The step's hidden states [T, D] (None when the model computed the sampling rows only) and those of
        the rows that sample [N, D] (None when none does)."""
        dev = self.device
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
        last = torch.tensor(inputs["last"], dtype=torch.long, device=dev) if inputs["last"] else None  # [N]
        if last is not None and not inputs["is_decode"] and not inputs.get("prompt_rows"):
            ctx.sample_rows = last  # prompt rows in the step: only the sampling rows' final states are read
        extra: dict[str, Any] = {}
        if "embeds" in inputs:  # image features: rows [K] of the step's tokens, their vectors [K, D]
            rows = torch.tensor(inputs["embed_rows"], dtype=torch.long, device=dev)
            extra["input_embeds"] = (rows, inputs["embeds"].to(dev))
        out = self.model.forward(input_ids, pos, ctx, **extra)  # out.hidden: [T, D], or [N, D] with out.rows
        if out.rows is not None:
            return None, out.hidden
        return out.hidden, None if last is None else out.hidden.index_select(0, last)

    def _forward_recompute(self, inputs: dict[str, Any]) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        lengths = inputs["lengths"]
        if not lengths:
            return None, None
        positions = [p for n in lengths for p in range(n)]
        ctx = ForwardContext.for_prompts(lengths, device=self.device)
        input_ids = torch.tensor(inputs["ids"], dtype=torch.int64, device=self.device)  # [T]
        pos = torch.tensor(positions, dtype=torch.int64, device=self.device)  # [T]
        extra = {"images": inputs["images"]} if "images" in inputs else {}
        hidden = self.model.forward(input_ids, pos, ctx, **extra).hidden  # hidden: [T, D]
        return hidden, hidden.index_select(0, (ctx.cu_seqlens_q[1:] - 1).long())  # each sequence's last: [B, D]
