"""The load stage's sharded path: ``pp × max(tp, ep)`` ranks (gloo on CPU, NCCL on CUDA, through
``agents.runtime.distributed.launch``) each ``load_model`` their slice of the checkpoint and report it; the parent
merges the ranks into one ``load`` section. A follower node runs its share of the same ranks (``load_rank``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.layout import effective_layout
from agents.pipeline.support.nodes import stage_node
from contract.planner.formats import hardware_declares

LOAD_TIMEOUT_S = 3600.0
PROGRESS_INTERVAL_S = 0.5


def load_rank(model_dir: str, dtype: str, device: str, manifest: Any, fail_on_nonfinite: bool,
              progress_queue: Any = None, quant: tuple[str, bool | None] = ("auto", None)) -> dict[str, Any]:
    """One rank (run by ``launch``): load this rank's slice; its report, or ``error`` with the loader's message.
    Rank 0 puts ``(done, total)`` on ``progress_queue`` as tensors stream (at most every PROGRESS_INTERVAL_S).
    ``quant``: the job's ``--quant-mode`` and whether its hardware declares the format's type (``quant_args``)."""
    import torch.distributed as dist

    from agents.runtime.loader import LoadError, load_model

    rank = dist.get_rank() if dist.is_initialized() else 0
    if str(device).startswith("cuda"):
        import torch

        device = f"cuda:{torch.cuda.current_device()}"  # init_distributed picked this rank's device
    last = [0.0]

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if progress_queue is not None and rank == 0 and (done == total or now - last[0] >= PROGRESS_INTERVAL_S):
            last[0] = now
            progress_queue.put((done, total))

    try:
        result = load_model(model_dir, dtype=dtype, device=device, manifest=manifest,
                            fail_on_nonfinite=fail_on_nonfinite, progress=progress, quant_mode=quant[0],
                            hardware_declares=quant[1])
    except LoadError as exc:  # no collective runs while loading: the peers finish on their own
        return {"rank": rank, "error": str(exc)}
    report = dict(result.report)
    # the bytes this rank holds: its slice of every sharded parameter plus the replicated ones
    report["rank_bytes"] = sum(p.numel() * p.element_size() for p in result.model.parameters())
    report["rank"] = rank
    return report


def load_sharded(ctx: StageContext, tp: int) -> dict[str, Any]:
    """Load ``ctx.model_dir`` over ``tp`` ranks and merge their reports into one ``load`` section. Rank 0's
    progress reaches ``ctx.progress`` from this thread; a cancel stops waiting (the ranks finish on their own)."""
    import queue
    import threading

    import torch.multiprocessing as mp

    from agents.runtime.distributed import launch

    _, ep, pp = effective_layout(ctx)
    world = pp * max(tp, ep)
    ctx.emit("log", f"loading over {world} ranks, tp={tp} ep={ep} pp={pp} "
                    f"({'NCCL' if str(ctx.device).startswith('cuda') else 'gloo'})")
    t0 = time.perf_counter()
    outcome: dict[str, Any] = {}
    with mp.get_context("spawn").Manager() as manager:
        updates = manager.Queue()
        args = (str(Path(ctx.model_dir)), ctx.dtype, ctx.device, ctx.manifest,
                bool(ctx.thresholds.get("fail_on_nonfinite", 0)), updates, quant_args(ctx))

        def run_ranks() -> None:
            try:
                outcome["reports"] = launch(load_rank, world, *args, tp_size=tp, ep_size=ep, pp_size=pp,
                                            timeout=LOAD_TIMEOUT_S, node=stage_node(ctx, "load"))
            except BaseException as exc:  # re-raised in the stage's thread
                outcome["error"] = exc

        thread = threading.Thread(target=run_ranks, name="load-ranks", daemon=True)
        thread.start()
        while thread.is_alive() or not updates.empty():
            ctx.check_cancelled()
            try:
                done, total = updates.get(timeout=0.2)
            except queue.Empty:
                continue
            ctx.progress(done, total, "tensors loaded (rank 0)")
        thread.join()
    error = outcome.get("error")
    if isinstance(error, RuntimeError):  # a crash, not a strictness error: the first line says which rank and why
        raise StageFailed(f"sharded load (tp={tp}) failed: {str(error).splitlines()[0]}") from error
    if error is not None:
        raise error
    section = merge_ranks(outcome["reports"], world, time.perf_counter() - t0)
    section.update(tp=tp, ep=ep, pp=pp)
    section["tp1_copy"] = tp1_copy(ctx, sum(r["bytes"] for r in section["ranks"]))
    return section


def quant_args(ctx: StageContext) -> tuple[str, bool | None]:
    """(``--quant-mode``, whether the job's hardware declares the release's quantised element type)."""
    return ctx.quant_mode, hardware_declares(ctx.config, (ctx.hardware or {}).get("dtypes"))


def tp1_copy(ctx: StageContext, model_bytes: int) -> dict[str, Any]:
    """Whether a whole (TP=1) copy of the model fits on one ``ctx.device`` now, for the stages that run the
    model in this process (inventory, align, eval): ``{bytes, available_bytes, fits}``."""
    import torch

    from agents.runtime.engine.model_runner import available_memory_bytes

    device = torch.device(ctx.device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", 0)
    available = available_memory_bytes(device)
    return {"bytes": model_bytes, "available_bytes": available, "fits": model_bytes < 0.9 * available}


def merge_ranks(reports: list[dict[str, Any]], tp: int, wall_seconds: float) -> dict[str, Any]:
    """One load section from the ranks' reports (rank 0's shards, checksums and statistics: it reads every
    tensor whole; the other ranks read only their slices). Any rank's loader error fails the stage naming it."""
    failed = [r for r in reports if "error" in r]
    if failed:
        first = failed[0]
        also = f" (also ranks {[r['rank'] for r in failed[1:]]})" if len(failed) > 1 else ""
        raise StageFailed(f"rank {first['rank']} of {tp}{also}: {first['error']}")
    lead = reports[0]
    mismatched = [r["rank"] for r in reports if (r["tensors"], r["bytes"]) != (lead["tensors"], lead["bytes"])]
    if mismatched:
        raise StageFailed(f"ranks {mismatched} saw a different checkpoint than rank 0 (tensors, bytes)")
    problems = [{**p, "rank": r["rank"]} for r in reports for p in r["problems"]]
    seconds = max(r["seconds"] for r in reports)
    section = {k: v for k, v in lead.items() if k not in ("rank", "rank_bytes")}
    # each pipeline stage's first rank has the statistics of the tensors its stage reads
    section["stats"] = {name: st for r in reports for name, st in (r.get("stats") or {}).items()}
    section.update(
        ok=not problems, problems=problems, tp=tp, seconds=round(seconds, 4),
        gb_per_s=round(lead["bytes"] / seconds / 1e9, 3) if seconds > 0 else None,
        wall_seconds=round(wall_seconds, 3),  # with process start and process-group setup
        peak_rss_bytes=max(r["peak_rss_bytes"] for r in reports),  # per rank, like memory per device
        peak_rss_bytes_sum=sum(r["peak_rss_bytes"] for r in reports),
        zero_copy_bytes=sum(r.get("zero_copy_bytes", 0) for r in reports),
        ranks=[{"rank": r["rank"], "bytes": r["rank_bytes"], "seconds": r["seconds"],
                "peak_rss_bytes": r["peak_rss_bytes"]} for r in reports],
    )
    return section
