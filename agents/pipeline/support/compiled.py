"""The compiled path in the pipeline (issue 13 §2), asked for by a job's ``bench.compile`` (true): the serve stage starts ``day0 serve --compile`` and records the server's compile evidence
(``/stats/compile``: compile seconds, graphs, graph breaks, recompiles, FX graph / AOT autograd cache hits and
misses); the bench stage runs one extra, bounded benchmark on an eager server at one concurrency level and
reports compiled against eager; the align stage compares compiled and eager greedy tokens
(``align_compiled``). Every section's evidence goes under its ``compile`` key.

The compiled path covers the native families on one process; otherwise the stages run eager and their
``compile`` key says why (``enabled`` false, ``reason``)."""

from __future__ import annotations

from typing import Any

import httpx

from agents.pipeline.support.context import StageContext, StageFailed

RATIO_NOTE = ("compiled and eager measured one after the other on the same host: on a busy host the ratio is "
              "noisy; compare ratios taken on a quiet one")


def requested(ctx: StageContext) -> bool:
    return ctx.bench.get("compile") is True


def unavailable_reason(ctx: StageContext) -> str | None:
    """Why this job's model cannot take the compiled path here, or None."""
    from agents.runtime.models.registry import runtime_path

    path, _ = runtime_path(ctx.config)
    if path != "native":
        return "the compiled path covers the native families; this model runs on the transformers fallback"
    from agents.pipeline.support.sharded_load import effective_layout

    tp, ep, pp = effective_layout(ctx)
    if max(tp, ep, pp) > 1:
        return f"the compiled path serves one process; this job serves tp={tp}, ep={ep}, pp={pp}"
    return None


def serve_args(ctx: StageContext) -> list[str]:
    """``--compile`` when the job asks for the compiled path and it can run."""
    return ["--compile"] if requested(ctx) and unavailable_reason(ctx) is None else []


def skipped(ctx: StageContext) -> dict[str, Any] | None:
    """The ``compile`` block of a stage that will not compile, or None when it will."""
    if not requested(ctx):
        return None
    reason = unavailable_reason(ctx)
    return {"requested": True, "enabled": False, "reason": reason} if reason else None


def serve_evidence(ctx: StageContext, url: str, ready_seconds: float) -> dict[str, Any]:
    """The serve section's ``compile`` block: the server's ``/stats/compile`` after its warm-up."""
    not_run = skipped(ctx)
    if not_run is not None:
        return not_run
    try:
        r = httpx.get(f"{url}/stats/compile", timeout=30)
        body = r.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise StageFailed(f"the compiled server did not answer /stats/compile: {exc}") from exc
    if r.status_code != 200 or body.get("enabled") is not True:
        raise StageFailed(f"the server was started with --compile but /stats/compile says {body!r:.300}")
    ctx.shared["compiled_server"] = url  # the bench compares this server with an eager one
    return {"requested": True, **body, "ready_seconds": round(ready_seconds, 3)}


def _summary(run: dict[str, Any]) -> dict[str, Any]:
    return {"concurrency": run["concurrency"], "output_tok_s": run["output_tok_s"], "req_s": run.get("req_s"),
            "ttft_ms_p50": (run.get("ttft_ms") or {}).get("p50"), "tpot_ms_p50": (run.get("tpot_ms") or {}).get("p50"),
            "failed": run.get("failed")}


def bench_compare(ctx: StageContext, section: dict[str, Any], settings: dict[str, Any]) -> dict[str, Any] | None:
    """The bench section's ``compile`` block: one benchmark on an eager server at one level of the sweep
    (``compile_compare_concurrency``, default the sweep's first), the same prompts (seed) as the compiled run at
    that level; None when the job did not ask for the compiled path."""
    not_run = skipped(ctx)
    if not requested(ctx) or not_run is not None:
        return not_run
    from agents.pipeline.stages import serve
    from agents.runtime.bench import run_benchmark

    if not ctx.shared.get("compiled_server"):  # the serve stage checked /stats/compile on it
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
    server = serve.ServerProcess(ctx.model_dir, dtype=ctx.dtype, device=ctx.device, tp=None,
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
