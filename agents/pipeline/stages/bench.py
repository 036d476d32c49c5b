"""The ``bench`` stage: the serving benchmark against the server the serve stage left running (or one started
here), with small defaults suited to the tiny test models; ``ctx.bench`` overrides them.

The defaults meet the portal's minimum baseline (``thresholds``: ``bench_min_requests`` 16 and
``bench_min_seconds`` 2 per level): 16 prompts a level, and a level that finishes them sooner goes on with
fresh prompts until it has run 2 s. A tiny model on a CPU runs a level in well under a second, so without the
minimum its percentiles would rest on a handful of requests; 2 s keeps the whole sweep plus the repeated-prompt
probe near 10 s."""

from __future__ import annotations

from typing import Any

import httpx

from agents.pipeline.stages.bench_vllm import run_vllm_benchmark, vllm_client
from agents.pipeline.support.compiled import requested, skipped
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.server import running_server, stop_server
from agents.pipeline.support.server_process import ServerProcess

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
    from agents.runtime.bench import format_table, run_benchmark

    settings = {**DEFAULTS, **{k: v for k, v in ctx.bench.items() if k in DEFAULTS}}
    if isinstance(settings["concurrency"], str):
        settings["concurrency"] = [int(c) for c in settings["concurrency"].split(",")]
    server = running_server(ctx)
    url = server.url
    keep = "eval" in ctx.state.stages_requested  # the eval stage queries this server next
    exe = vllm_client(ctx, server)  # vLLM's own client for vLLM's server, when the agent has it
    try:
        if exe is not None:
            section = run_vllm_benchmark(ctx, exe, server, settings, lambda level: run_benchmark(
                url, **{**settings, "concurrency": [level], "long_context": False, "probe": True})["probe"])
        else:
            section = run_benchmark(url, **settings)
            section["client"] = "day0 (agents.runtime.bench)"  # which client measured it
    except (ValueError, RuntimeError, httpx.HTTPError) as exc:
        keep = False
        raise StageFailed(f"benchmark against {url} failed: {exc}") from exc
    except BaseException:
        keep = False
        raise
    finally:
        if not keep:
            stop_server(ctx)  # the bench is the server's last user
    for run in [*section["runs"], *([section["long_context"]] if section.get("long_context") else [])]:
        add_rank_overheads(run)
    ctx.emit("log", "benchmark:\n" + format_table(section))
    if requested(ctx):  # one bounded eager run at one level: compiled against eager
        section["compile"] = compile_compare(ctx, section, settings)
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


RATIO_NOTE = ("compiled and eager measured one after the other on the same host: on a busy host the ratio is "
              "noisy; compare ratios taken on a quiet one")


def _summary(run: dict[str, Any]) -> dict[str, Any]:
    return {"concurrency": run["concurrency"], "output_tok_s": run["output_tok_s"], "req_s": run.get("req_s"),
            "ttft_ms_p50": (run.get("ttft_ms") or {}).get("p50"), "tpot_ms_p50": (run.get("tpot_ms") or {}).get("p50"),
            "failed": run.get("failed")}


def compile_compare(ctx: StageContext, section: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any] | None:
    """The bench section's ``compile`` block: one benchmark on an eager server at one level of the sweep
    (``compile_compare_concurrency``, default the sweep's first), the same prompts (seed) as the compiled run at
    that level; None when the job did not ask for the compiled path."""
    not_run = skipped(ctx)
    if not requested(ctx) or not_run is not None:
        return not_run
    from agents.runtime.bench import run_benchmark

    if not ctx.state.compiled_server:  # the serve stage checked /stats/compile on it
        return {"requested": True, "enabled": False,
                "reason": "the benchmarked server showed no compile evidence (serve.compile): nothing to compare"}
    levels = list(settings["concurrency"])
    level = ctx.bench.get("compile_compare_concurrency", levels[0])
    if level not in levels:
        raise StageFailed(f"bench.compile_compare_concurrency {level!r} is not a level of the sweep {levels}")
    index = levels.index(level)
    compiled_run = next(r for r in section["runs"] if r["concurrency"] == level)
    eager_settings = {**settings, "concurrency": [level], "long_context": False, "probe": False,
                      "seed": int(settings.get("seed") or 0) + index}
    server = ServerProcess(ctx.model_dir, dtype=ctx.dtype, device=ctx.device, tp=None,
                                 log_path=ctx.workdir / "serve-eager.log",
                                 extra_args=[str(a) for a in ctx.bench.get("serve_args", [])])
    try:
        server.wait_ready(float(ctx.bench.get("ready_timeout", 900)), ctx)
        eager = run_benchmark(server.url, **eager_settings)
    except (ValueError, RuntimeError, httpx.HTTPError) as exc:
        raise StageFailed(f"the eager comparison benchmark failed: {exc}") from exc
    finally:
        server.stop()
    eager_run = eager["runs"][0]
    ratio = (compiled_run["output_tok_s"] / eager_run["output_tok_s"]) if eager_run["output_tok_s"] else None
    return {"requested": True, "enabled": True, "concurrency": level, "compiled": _summary(compiled_run),
            "eager": _summary(eager_run), "speedup_output_tok_s": round(ratio, 4) if ratio else None,
            "note": RATIO_NOTE}
