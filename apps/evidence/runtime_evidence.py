"""The cell page's runtime evidence read from the newest sections' JSON (only the keys shown are fetched): each
benchmark run's communication overhead (rank 0, per rank, the slowest rank), TPOT jitter and MoE expert balance,
the compiled path of the serve, bench and align sections (``compile`` blocks, shown only when present) and the
soak's device memory. ``runtime_evidence`` serves the same to the cell API, so the page and the API agree."""

from __future__ import annotations

from typing import Any

from apps.evidence.models import StageResult
from apps.evidence.selectors import newest_results

MAX_EXPERTS_SHOWN = 512  # a bar per expert: wider sections are cut (the JSON export keeps them all)


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _numbers(values: Any, limit: int = MAX_EXPERTS_SHOWN) -> list[int | float]:
    """The numbers of a list (token counts stay integers), at most ``limit``."""
    return [v for v in values[:limit] if _number(v) is not None] if isinstance(values, list) else []


def bars(values: list[int | float], width: int = 240, height: int = 28) -> list[dict[str, float]]:
    """SVG rectangles of a bar strip (x, y, w, h), tallest value the full height."""
    top = max(values, default=0)
    if not values or top <= 0:
        return []
    w = width / len(values)
    return [{"x": round(i * w, 2), "w": round(max(w - (1 if w > 3 else 0), 0.5), 2),
             "h": round(height * v / top, 2), "y": round(height - height * v / top, 2)} for i, v in enumerate(values)]


def tpot_jitter(run: dict[str, Any]) -> float | None:
    """The run's ``tpot_jitter`` (p99 / p50), or its TPOT percentiles' ratio for runs recorded before the key."""
    own = _number(run.get("tpot_jitter"))
    if own is not None:
        return own
    tpot = run.get("tpot_ms") if isinstance(run.get("tpot_ms"), dict) else {}
    p50, p99 = _number(tpot.get("p50")), _number(tpot.get("p99"))
    return round(p99 / p50, 4) if p50 and p99 is not None else None


def expert_balance(raw: Any) -> dict[str, Any] | None:
    """A run's ``expert_balance`` with its bar strips, or None when the model routes no experts."""
    if not isinstance(raw, dict) or _number(raw.get("max_over_mean")) is None:
        return None
    per_expert = _numbers(raw.get("tokens_per_expert"))
    per_rank = _numbers(raw.get("tokens_per_ep_rank"))
    return {**{k: raw.get(k) for k in ("layers", "experts", "max_over_mean", "worst_layer_max_over_mean", "cv",
                                       "routed_tokens", "ep_size", "ep_max_over_mean")},
            "tokens_per_expert": per_expert, "tokens_per_ep_rank": per_rank,
            "cut": isinstance(raw.get("tokens_per_expert"), list) and len(raw["tokens_per_expert"]) > len(per_expert),
            "expert_bars": bars(per_expert), "min_tokens": min(per_expert, default=None),
            "max_tokens": max(per_expert, default=None)}


def run_extras(run: dict[str, Any]) -> dict[str, Any]:
    """A benchmark run's runtime evidence (communication overhead, TPOT jitter, expert balance), from one ``runs``
    entry of a bench section."""
    per_rank = [_number(v) for v in run.get("comm_overhead_ratio_per_rank") or []] \
        if isinstance(run.get("comm_overhead_ratio_per_rank"), list) else []
    return {"concurrency": run.get("concurrency"), "comm_overhead_ratio": _number(run.get("comm_overhead_ratio")),
            "comm_overhead_ratio_per_rank": per_rank if len(per_rank) > 1 else [],
            "comm_overhead_ratio_max": _number(run.get("comm_overhead_ratio_max")),
            "tpot_jitter": tpot_jitter(run), "expert_balance": expert_balance(run.get("expert_balance"))}


def section_keys(results: dict[str, StageResult]) -> dict[str, dict[str, Any]]:
    """stage -> the keys of the newest serve, bench and align sections this page reads (``runs``,
    ``long_context``, ``compile``, align's ``fallback_reference_identical``), in one query."""
    ids = {results[stage].pk: stage for stage in ("serve", "bench", "align") if stage in results}
    if not ids:
        return {}
    rows = StageResult.objects.filter(pk__in=ids).values_list("pk", "section__runs", "section__long_context",
                                                               "section__compile",
                                                               "section__fallback_reference_identical")
    return {ids[pk]: {"runs": runs, "long_context": long_run, "compile": block, "fallback_reference_identical": same}
            for pk, runs, long_run, block, same in rows}


def bench_extras(bench: dict[str, Any] | None) -> list[dict[str, Any]]:
    """Per run of the newest bench section (``section_keys``: the sweep's runs, then its long-context run)."""
    if not bench:
        return []
    runs, long_run = bench.get("runs"), bench.get("long_context")
    out = [run_extras(r) for r in runs or [] if isinstance(r, dict)] if isinstance(runs, list) else []
    if isinstance(long_run, dict):
        out.append({**run_extras(long_run), "long_context": True})
    return out


def _hits(cache: dict[str, Any], kind: str) -> str | None:
    """"3 hits · 1 miss" of one compilation cache; None when the block has no cache counters."""
    if not cache:
        return None
    hit, miss = cache.get(f"{kind}_hit", "–"), cache.get(f"{kind}_miss", "–")
    return f"{hit} hit{'' if hit == 1 else 's'} · {miss} miss{'' if miss == 1 else 'es'}"


def _compile_rows(block: dict[str, Any]) -> list[tuple[str, Any]]:
    cache = block.get("cache") if isinstance(block.get("cache"), dict) else {}
    rows = [("compile seconds", block.get("compile_seconds")), ("graphs", block.get("graphs")),
            ("graph breaks", block.get("graph_breaks")),
            ("recompiles after warm-up", block.get("recompiles_after_warmup")),
            ("FX graph cache", _hits(cache, "fxgraph")), ("AOT autograd cache", _hits(cache, "aot_autograd"))]
    if block.get("ready_seconds") is not None:
        rows.append(("server ready", f"{block['ready_seconds']} s"))
    return [(label, value) for label, value in rows if value is not None]


def compiled_path(results: dict[str, StageResult], keys: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The ``compile`` blocks of the newest serve, bench and align sections (``keys``: ``section_keys``); None
    when none has one (a job that did not ask for the compiled path)."""
    blocks = {stage: k["compile"] for stage, k in keys.items() if isinstance(k.get("compile"), dict)}
    if not blocks:
        return None
    out: dict[str, Any] = {"jobs": {stage: results[stage].job_id for stage in blocks}}
    serve = blocks.get("serve")
    if serve is not None:
        out["serve"] = {"enabled": serve.get("enabled"), "reason": serve.get("reason"),
                        "rows": _compile_rows(serve) if serve.get("enabled") else [],
                        "breaks": [b for b in serve.get("graph_break_reasons") or [] if isinstance(b, dict)][:5],
                        "recompile_reasons": [str(r) for r in serve.get("recompile_reasons") or []][:5]}
    bench = blocks.get("bench")
    if bench is not None:
        compiled = bench.get("compiled") if isinstance(bench.get("compiled"), dict) else {}
        eager = bench.get("eager") if isinstance(bench.get("eager"), dict) else {}
        out["bench"] = {"enabled": bench.get("enabled"), "reason": bench.get("reason"),
                        "concurrency": bench.get("concurrency"), "note": bench.get("note"),
                        "compiled_tok_s": _number(compiled.get("output_tok_s")),
                        "eager_tok_s": _number(eager.get("output_tok_s")),
                        "compiled_tpot": _number(compiled.get("tpot_ms_p50")),
                        "eager_tpot": _number(eager.get("tpot_ms_p50")),
                        "speedup": _number(bench.get("speedup_output_tok_s"))}
    align = blocks.get("align")
    if align is not None:
        divergences = [d for d in align.get("divergences") or [] if isinstance(d, dict)]
        out["align"] = {"enabled": align.get("enabled"), "reason": align.get("reason"),
                        "passed": align.get("passed"), "equal": align.get("equal"),
                        "match_rate": _number(align.get("token_match_rate")), "tokens": align.get("tokens"),
                        "prompts": align.get("prompts"), "first": divergences[0] if divergences else None,
                        "divergences": len(divergences), "rows": _compile_rows(align) if align.get("enabled") else []}
    return out


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def soak_device_memory(job_id: int | None, windows: Any, block: Any) -> dict[str, Any] | None:
    """A soak section's device memory: per window the bytes allocated (and the peak) as the server reported them
    (CUDA: torch's counters; none on CPU), with the section's ``device_memory`` block (source, slope, note).
    ``reported`` says whether the block is there; None when neither is (a soak from before the keys)."""
    block = block if isinstance(block, dict) else {}
    points = []
    for w in windows if isinstance(windows, list) else []:
        if not isinstance(w, dict) or _number(w.get("t")) is None or _number(w.get("device_allocated_bytes")) is None:
            continue
        peak = _number(w.get("device_max_allocated_bytes"))
        points.append({"t": float(w["t"]), "allocated_bytes": int(w["device_allocated_bytes"]),
                       "max_allocated_bytes": None if peak is None else int(peak)})
    if not block and not points:
        return None
    allocated = [p["allocated_bytes"] for p in points]
    return {"job": job_id, "reported": bool(block), "source": _text(block.get("source")),
            "memory_slope": _number(block.get("memory_slope")), "note": _text(block.get("note")),
            "windows": points, "min_bytes": min(allocated, default=None), "max_bytes": max(allocated, default=None)}


def _api_compiled(compiled: dict[str, Any] | None) -> dict[str, Any] | None:
    """``compiled_path`` for the API: each stage's rows as {label, value} objects."""
    if compiled is None:
        return None
    out = dict(compiled)
    for stage in ("serve", "align"):
        if stage in out:
            out[stage] = {**out[stage], "rows": [{"label": label, "value": value} for label, value in out[stage]["rows"]]}
    return out


def _api_run(run: dict[str, Any]) -> dict[str, Any]:
    """One ``bench_extras`` entry for the API: without the page's SVG bars, ``long_context`` always present."""
    balance = run["expert_balance"]
    if balance is not None:
        balance = {k: v for k, v in balance.items() if k != "expert_bars"}
    return {**run, "long_context": bool(run.get("long_context")), "expert_balance": balance}


def runtime_evidence(model_id: int, hardware_id: int) -> dict[str, Any]:
    """The cell API's ``runtime_evidence``: what the cell page shows of the runtime (the same selectors): the
    compiled path (``compiled_path``), every bench run's comm overhead, TPOT jitter and expert balance
    (``bench_extras``) and the newest soak's device memory (``soak_device_memory``). Three queries."""
    results = newest_results(model_id, hardware_id)
    keys = section_keys(results)
    soak = results.get("soak")
    memory = None
    if soak is not None:
        windows, block = StageResult.objects.filter(pk=soak.pk).values_list(
            "section__windows", "section__device_memory").first() or (None, None)
        memory = soak_device_memory(soak.job_id, windows, block)
    bench = results.get("bench")
    return {"compiled_path": _api_compiled(compiled_path(results, keys)),
            "bench_job": bench.job_id if bench is not None else None,
            "bench_runs": [_api_run(r) for r in bench_extras(keys.get("bench"))],
            "soak_device_memory": memory}
