"""The ``bench`` stage: the serving benchmark against the server the serve stage left running (or one started
here), with small defaults suited to the tiny test models; ``ctx.bench`` overrides them.

The defaults meet the portal's minimum baseline (``thresholds``: ``bench_min_requests`` 16 and
``bench_min_seconds`` 2 per level): 16 prompts a level, and a level that finishes them sooner goes on with
fresh prompts until it has run 2 s. A tiny model on a CPU runs a level in well under a second, so without the
minimum its percentiles would rest on a handful of requests; 2 s keeps the whole sweep plus the repeated-prompt
probe near 10 s."""

from __future__ import annotations

from typing import Any

from agents.pipeline.stages import serve
from agents.pipeline.support import compiled
from agents.pipeline.support.context import StageContext, StageFailed

DEFAULTS: dict[str, Any] = {
    "concurrency": [1, 2, 4],  # a baseline sweeps at least 3 levels (verdicts: bench_min_concurrency_levels)
    "input_len": 32,
    "output_len": 16,
    "num_prompts": 16,  # bench_min_requests
    "min_seconds": 2.0,  # bench_min_seconds: a level runs on with fresh prompts until it has run this long
    "probe": True,  # the highest level again, one repeated prompt alternating with fresh ones
    "request_rate": None,
    "long_context": True,
    "long_input_len": 256,
    "images_per_request": 0,  # N > 0: chat requests with N images each (``--images-per-request``)
}


def run(ctx: StageContext) -> dict[str, Any]:
    """The bench section: runs (one per concurrency), long_context, peak_memory_bytes."""
    import httpx

    from agents.runtime.bench import format_table, run_benchmark

    settings = {**DEFAULTS, **{k: v for k, v in ctx.bench.items() if k in DEFAULTS}}
    if isinstance(settings["concurrency"], str):
        settings["concurrency"] = [int(c) for c in settings["concurrency"].split(",")]
    started_here = ctx.shared.get("server") is None
    if started_here:
        server = serve.start_server(ctx)
        server.wait_ready(float(ctx.bench.get("ready_timeout", 900)), ctx)
    url = ctx.shared["server"].url
    keep = "eval" in ctx.shared.get("stages_requested", ())  # the eval stage queries this server next
    try:
        section = run_benchmark(url, **settings)
    except (ValueError, RuntimeError, httpx.HTTPError) as exc:
        keep = False
        raise StageFailed(f"benchmark against {url} failed: {exc}") from exc
    finally:
        if not keep:
            serve.stop(ctx)  # the bench is the server's last user
    for run in [*section["runs"], *([section["long_context"]] if section.get("long_context") else [])]:
        add_rank_overheads(run)
    ctx.emit("log", "benchmark:\n" + format_table(section))
    if compiled.requested(ctx):  # one bounded eager run at one level: compiled against eager
        section["compile"] = compiled.bench_compare(ctx, section, settings)
    failed = sum(run["failed"] for run in section["runs"])
    if failed:
        section["notes"] = [f"{failed} request(s) failed: {section['runs'][0].get('errors')}"]
    return section


def add_rank_overheads(run: dict[str, Any]) -> None:
    """Beside ``comm_overhead_ratio`` (rank 0's): ``comm_overhead_ratio_per_rank`` (each rank's collective time
    over its own step time, in rank order, as a multi-rank server timed them: ``run["comm"]["ranks"]``) and
    ``comm_overhead_ratio_max`` (the rank that waits longest); one rank: its own ratio."""
    comm = run.get("comm") or {}
    own = run.get("comm_overhead_ratio")
    ranks = comm.get("ranks") or []
    run["comm_overhead_ratio_per_rank"] = [r.get("comm_overhead_ratio") for r in ranks] if ranks else \
        ([own] if own is not None else [])
    run["comm_overhead_ratio_max"] = comm.get("comm_overhead_ratio_max", own) if ranks else own
