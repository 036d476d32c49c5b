"""Whether a job takes the compiled path, asked for by its ``bench.compile`` (true): the serve stage starts
``day0 serve --compile`` and records the server's compile evidence (``/stats/compile``: compile seconds, graphs,
graph breaks, recompiles, FX graph / AOT autograd cache hits and misses); the bench stage runs one extra, bounded
benchmark on an eager server at one concurrency level and reports compiled against eager; the align stage
compares compiled and eager greedy tokens (``stages/align/compiled.py``). Every section's evidence goes under its
``compile`` key.

The compiled path covers the native families on one process; otherwise the stages run eager and their
``compile`` key says why (``enabled`` false, ``reason``)."""

from __future__ import annotations

from typing import Any

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.layout import effective_layout


def requested(ctx: StageContext) -> bool:
    return ctx.bench.get("compile") is True


def unavailable_reason(ctx: StageContext) -> str | None:
    """Why this job's model cannot take the compiled path here, or None."""
    from agents.runtime.models.registry import runtime_path

    path, _ = runtime_path(ctx.config)
    if path != "native":
        return "the compiled path covers the native families; this model runs on the transformers fallback"
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
