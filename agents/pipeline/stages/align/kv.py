"""KV-cache consistency (the ``align.kv_cache`` section): for a prompt growing towards the model's context,
the logits of incremental decoding through the paged cache (chunked prefill, then one token at a time, built
by the engine's own model runner) equal those of a full recomputation without a cache, in fp32. The blocks
of each run go back to the pool and the next, longer run reuses them."""

from __future__ import annotations

import random
from typing import Any

import torch

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.models import fp32_target
from contract import thresholds

DEFAULT_THRESHOLD = 1e-4
BLOCK_SIZE = 16
PREFILL_CHUNK = 37  # deliberately not a multiple of the block size


def _fp32_model(ctx: StageContext) -> Any:
    return fp32_target(ctx)


def check_lengths(context: int, cap: int) -> list[int]:
    """Lengths growing by 4× up to the context (capped), longest last."""
    top = max(8, min(context - 1, cap))
    lengths = [top]
    while lengths[-1] // 4 >= 8:
        lengths.append(lengths[-1] // 4)
    return sorted(set(lengths))


@torch.inference_mode()
def _max_err_at(model: Any, runner: Any, blocks: Any, ids: list[int], decode_steps: int, tag: str,
                ) -> tuple[float, float, set]:
    """(max |incremental - full| over the checked logits, max |full logits|, the blocks the sequence used)."""
    from agents.runtime.context import ForwardContext
    from agents.runtime.engine.sampling_params import SamplingParams
    from agents.runtime.engine.scheduler import ScheduledBatch
    from agents.runtime.engine.sequence import Sequence

    length = len(ids)
    prefill = length - decode_steps
    dev = runner.device
    hidden = model.forward(
        torch.tensor(ids, device=dev),
        torch.arange(length, device=dev),
        ForwardContext.for_prompts([length], device=dev),
    ).hidden  # hidden: [L, D]
    checked = list(range(prefill - 1, length))
    ref = model.compute_logits(hidden[checked]).float()  # ref: [decode_steps + 1, V]
    seq = Sequence(tag, ids[:prefill], SamplingParams(max_tokens=1))
    got: list[torch.Tensor] = []
    try:
        while seq.num_computed_tokens < prefill:
            n = min(PREFILL_CHUNK, prefill - seq.num_computed_tokens)
            blocks.allocate(seq, seq.num_computed_tokens + n)
            ends, logits = runner.run(ScheduledBatch([seq], [n]), blocks)
            seq.num_computed_tokens += n
        got.append(logits[0])
        for pos in range(prefill, length):
            seq.token_ids.append(ids[pos])
            blocks.allocate(seq, pos + 1)
            _, logits = runner.run(ScheduledBatch([seq], [1]), blocks)
            seq.num_computed_tokens += 1
            got.append(logits[0])
        used = set(seq.block_table)
    finally:
        blocks.free(seq)
    err = float((torch.stack(got).float() - ref).abs().max())
    return err, float(ref.abs().max()), used


def run(ctx: StageContext) -> dict[str, Any]:
    """``{"lengths", "max_abs_err", "passed", ...}`` for the align section."""
    from agents.runtime.engine.block_manager import BlockManager
    from agents.runtime.engine.model_runner import ModelRunner

    model = _fp32_model(ctx)
    threshold = float(ctx.thresholds.get("kv_cache_max_abs_err", DEFAULT_THRESHOLD))
    rel_threshold = float(ctx.thresholds.get("kv_cache_max_rel_err", thresholds.TABLE["kv_cache_max_rel_err"].default))
    if model.kv_cache_spec() is None:
        return {
            "lengths": [],
            "max_abs_err": 0.0,
            "passed": True,
            "threshold": threshold,
            "path": "recompute",
            "notes": ["no paged cache on this path: every step recomputes the sequence, nothing to drift"],
        }
    config = ctx.config.get("text_config") or ctx.config  # a vision-language model: its decoder's
    context = int(config.get("max_position_embeddings") or 2048)
    lengths = check_lengths(context, int(ctx.thresholds.get("kv_cache_max_len", 1024)))
    num_blocks = -(-lengths[-1] // BLOCK_SIZE)  # exactly the longest run: later runs must reuse freed blocks
    runner = ModelRunner(model, ctx.device, BLOCK_SIZE, num_blocks)
    blocks = BlockManager(num_blocks, BLOCK_SIZE)
    vocab = int(config.get("vocab_size") or 256)
    rng = random.Random(0)
    per_length, seen, reused, all_free = [], set(), False, True
    for i, length in enumerate(lengths):
        ctx.check_cancelled()
        ids = [rng.randrange(min(16, vocab // 4), vocab) for _ in range(length)]
        err, scale, used = _max_err_at(model, runner, blocks, ids, min(32, length // 2), f"kv-{length}")
        reused |= bool(used & seen)
        seen |= used
        all_free &= blocks.num_free_blocks == num_blocks
        per_length.append({"length": length, "max_abs_err": err, "max_rel_err": err / max(scale, 1e-12),
                           "blocks": len(used)})
        ctx.progress(i + 1, len(lengths), "KV-cache consistency lengths")
    worst = max(row["max_abs_err"] for row in per_length)
    # normwise, as the operator checks define it: the absolute error grows with the logits' scale
    worst_rel = max(row["max_rel_err"] for row in per_length)
    return {
        "lengths": lengths,
        "max_abs_err": worst,
        "max_rel_err": worst_rel,
        "passed": worst_rel <= rel_threshold and all_free and reused,
        "threshold": threshold,
        "rel_threshold": rel_threshold,
        "per_length": per_length,
        "blocks_freed": all_free,
        "blocks_reused": reused,
        "block_size": BLOCK_SIZE,
        "path": "paged",
    }
