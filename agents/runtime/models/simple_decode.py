"""A minimal paged-cache greedy decoder driving a ``RuntimeModel`` through ``ForwardContext`` directly: used by
tests and benchmarks to exercise the paged path without the full engine (which lives in ``engine/``)."""

from __future__ import annotations

import torch

from agents.runtime.context import ForwardContext


class PagedCache:
    """Contiguous block ranges per sequence in one pre-allocated pool (enough for tests and benchmarks)."""

    def __init__(self, model, max_tokens: int, num_seqs: int = 1, block_size: int = 16,
                 device: torch.device | str = "cpu") -> None:
        spec = model.kv_cache_spec()
        if spec is None or spec.kind != "kv":
            raise ValueError("model has no standard paged KV cache")
        self.block_size = block_size
        self.blocks_per_seq = -(-max_tokens // block_size)
        num_blocks = self.blocks_per_seq * num_seqs
        shape = (num_blocks, block_size, spec.num_kv_heads, spec.head_dim)
        self.caches = [(torch.zeros(shape, dtype=spec.dtype, device=device),
                        torch.zeros(shape, dtype=spec.dtype, device=device)) for _ in range(spec.num_layers)]
        model.bind_kv_cache(self.caches)
        # Reverse block order exercises the block table (blocks of one sequence are not adjacent in the pool).
        ids = torch.arange(num_blocks - 1, -1, -1, dtype=torch.int32, device=device)
        self.block_tables = ids.view(num_seqs, self.blocks_per_seq)  # [B, blocks_per_seq]
        self.device = device

    def slots(self, seq: int, positions: torch.Tensor) -> torch.Tensor:
        blocks = self.block_tables[seq].long()[positions // self.block_size]
        return blocks * self.block_size + positions % self.block_size  # [n] int64


def prefill_context(cache: PagedCache, seqs: list[int], cached: list[int], new: list[int]) -> tuple:
    """Context and positions for new tokens of ``seqs`` after ``cached`` tokens each."""
    dev = cache.device
    positions = torch.cat([torch.arange(c, c + n, device=dev) for c, n in zip(cached, new, strict=False)])
    slots = torch.cat([cache.slots(s, torch.arange(c, c + n, device=dev)) for s, c, n in zip(seqs, cached, new, strict=False)])
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32, device=dev)
    cu[1:] = torch.cumsum(torch.tensor(new, dtype=torch.int32, device=dev), 0)
    total = [c + n for c, n in zip(cached, new, strict=False)]
    ctx = ForwardContext(
        cu_seqlens_q=cu, seqlens_k=torch.tensor(total, dtype=torch.int32, device=dev), max_seqlen_q=max(new),
        max_seqlen_k=max(total), slot_mapping=slots, block_tables=cache.block_tables[seqs],
        is_decode=all(n == 1 for n in new),
    )
    return ctx, positions


@torch.inference_mode()
def greedy_decode(model, prompts: list[list[int]], max_new_tokens: int, *, block_size: int = 16,
                  prefill_chunk: int | None = None, device: torch.device | str = "cpu") -> list[list[int]]:
    """Greedy continuation of each prompt (batched, paged cache); chunked prefill when ``prefill_chunk``."""
    longest = max(len(p) for p in prompts) + max_new_tokens
    cache = PagedCache(model, longest, len(prompts), block_size, device)
    seqs = list(range(len(prompts)))
    done = [0] * len(prompts)
    chunk = prefill_chunk or longest
    last = torch.zeros(len(prompts), dtype=torch.long, device=device)
    while any(d < len(p) for d, p in zip(done, prompts, strict=False)):
        new = [min(chunk, len(p) - d) for d, p in zip(done, prompts, strict=False)]
        ctx, positions = prefill_context(cache, seqs, done, new)
        ids = torch.cat([torch.tensor(p[d : d + n], dtype=torch.long) for p, d, n in zip(prompts, done, new, strict=False)])
        hidden = model.forward(ids.to(device), positions, ctx).hidden
        done = [d + n for d, n in zip(done, new, strict=False)]
        finished = [i for i, (d, n, p) in enumerate(zip(done, new, prompts, strict=False)) if n and d == len(p)]
        if finished:
            ends = (ctx.cu_seqlens_q[1:] - 1).long()[finished]
            last[finished] = model.compute_logits(hidden[ends]).argmax(-1)  # [len(finished)]
    outputs = [[t] for t in last.tolist()]
    for _ in range(max_new_tokens - 1):
        ctx, positions = prefill_context(cache, seqs, done, [1] * len(seqs))
        hidden = model.forward(last, positions, ctx).hidden
        last = model.compute_logits(hidden).argmax(-1)  # [B]
        done = [d + 1 for d in done]
        for out, t in zip(outputs, last.tolist(), strict=False):
            out.append(t)
    return outputs
