"""The per-stage rules and ``judge`` of migration 0004 (frozen; see ``base``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from apps.evidence.migrations._frozen_0004 import thresholds as th
from apps.evidence.migrations._frozen_0004.base import (
    INCOMPLETE,
    LATENCY_METRICS,
    LOWER_IS_BETTER,
    PASS,
    PERCENTILES,
    Context,
    Verdict,
    _number,
    _text,
    _token_ids,
    manifest_mismatches,
)


# --- plan ------------------------------------------------------------------------------------------------

def _plan(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    plan = s.get("plan")
    if not isinstance(plan, Mapping) or not plan:
        v.missing("plan missing (tp, pp, ep, devices)")
        return
    degrees = {k: plan.get(k) for k in ("tp", "pp", "ep")}
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in degrees.values()):
        v.missing(f"plan degrees must be positive integers, got tp={degrees['tp']} pp={degrees['pp']} "
                  f"ep={degrees['ep']}")
        return
    config = ctx.model.config
    if ctx.hardware is None or not config:
        # no hardware or config to recompute with (a standalone run): the section's own numbers must agree
        per_device, memory = _number(s.get("bytes_per_device")), _number(s.get("memory_per_device"))
        if per_device is None or memory is None:
            v.missing("bytes_per_device and memory_per_device are needed to judge the plan without the hardware")
        elif per_device > memory:
            v.fail(f"needs {int(per_device)} bytes per device, the device has {int(memory)}")
        v.note("fits judged from the section's own bytes (no hardware facts to recompute with)")
        return
    planner = ctx.planner
    if planner is None:
        from contract.planner import plan_report as planner  # arithmetic over the config, not frozen
    dtype = s.get("dtype") if isinstance(s.get("dtype"), str) and s.get("dtype") else (ctx.dtype or "bfloat16")
    try:
        report = planner(dict(config), memory_bytes=ctx.hardware.memory_bytes,
                         devices_per_node=ctx.hardware.devices_per_node, dtype=dtype,
                         max_nodes=int(t.get("max_nodes", 16)), shared_memory=ctx.hardware.shared_memory,
                         tp=degrees["tp"], pp=degrees["pp"], ep=degrees["ep"])
    except Exception as exc:  # a config or plan the planner refuses is a failed plan, named
        v.fail(f"the portal's planner cannot plan tp={degrees['tp']} pp={degrees['pp']} ep={degrees['ep']} at "
               f"{dtype}: {type(exc).__name__}: {exc}")
        return
    if not report.get("plan"):
        v.fail(f"no valid plan with tp={degrees['tp']} pp={degrees['pp']} ep={degrees['ep']}: "
               f"{report.get('message', 'the degrees do not divide the model')}")
    elif not report.get("fits"):
        v.fail(f"recomputed for this hardware at {dtype}, tp={degrees['tp']} pp={degrees['pp']} "
               f"ep={degrees['ep']} does not fit: {report.get('message') or 'needs more memory than a device has'}")
    elif plan.get("devices") is not None and plan.get("devices") != report["plan"].get("devices"):
        v.fail(f"the plan claims {plan.get('devices')} devices, tp×pp×ep recomputes to {report['plan'].get('devices')}")


# --- load ------------------------------------------------------------------------------------------------

def _load(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    shards = s.get("shards")
    tensors = s.get("tensors")
    problems = s.get("problems")
    if not isinstance(shards, list) or not shards:
        v.missing("shards missing: no checksum of any weight file")
    elif any(not (isinstance(x, Mapping) and isinstance(x.get("sha256"), str) and len(x["sha256"]) == 64)
             for x in shards):
        v.missing("a shard has no sha256 digest")
    if not isinstance(tensors, int) or isinstance(tensors, bool) or tensors <= 0:
        v.missing("tensors (the count loaded and verified) missing")
    elif ctx.model.declared_tensors is not None and tensors != ctx.model.declared_tensors:
        v.fail(f"{tensors} tensors loaded, the model declares {ctx.model.declared_tensors}")
    if problems is None:
        v.missing("problems missing (an empty list when every tensor verified)")
    elif not isinstance(problems, list):
        v.missing("problems must be a list")
    elif problems:
        first = problems[0] if isinstance(problems[0], Mapping) else {}
        v.fail(f"{len(problems)} problem(s), first {first.get('tensor') or first.get('file')}: {first.get('problem')}")
    if v.status == INCOMPLETE or not isinstance(shards, list):
        return
    if ctx.model.manifest:
        for mismatch in manifest_mismatches(shards, ctx.model.manifest):
            v.fail(mismatch)
        if ctx.model.manifest_source == "first seen":
            v.note("digests compared with the manifest first seen on an earlier load")
    else:
        v.note("the release has no manifest yet: these digests are recorded as first seen")


# --- align -----------------------------------------------------------------------------------------------

def _align_rows(v: Verdict, rows: Any, part: str, key: str, cos_key: str, rel_key: str | None,
                t: Mapping[str, float]) -> int:
    if not isinstance(rows, list) or not rows:
        v.missing(f"{part} missing")
        return 0
    checked = 0
    for row in rows:
        name = row.get(key) if isinstance(row, Mapping) else None
        if not isinstance(row, Mapping):
            v.missing(f"{part}: a row is not an object")
            continue
        if row.get("status") == "unchecked":
            v.note(f"{part} {name} unchecked")
            continue
        cosine = _number(row.get("cosine"))
        rel = _number(row.get("max_rel_err"))
        label = f"layer {name}" if part == "layers" else f"{part[:-1]} {name}"
        if cosine is None:
            v.fail(f"{label} has no cosine ({row.get('problem') or 'not compared'})")
            continue
        checked += 1
        if cosine < t[cos_key]:
            v.fail(f"{label} cosine {_text(cosine)} is below {_text(t[cos_key])}")
        if rel_key is not None and math.isfinite(t[rel_key]):
            if rel is None:
                v.fail(f"{label} has no max_rel_err")
            elif rel > t[rel_key]:
                v.fail(f"{label} max_rel_err {_text(rel)} is above {_text(t[rel_key])}")
    if not checked and v.status == PASS:
        v.missing(f"{part}: no row was checked")
    return checked


def _e2e(v: Verdict, e2e: Any, t: Mapping[str, float]) -> None:
    if not isinstance(e2e, Mapping) or not e2e:
        v.missing("e2e missing")
        return
    tokens, prompts = e2e.get("tokens"), e2e.get("prompts")
    divergences = e2e.get("divergences")
    if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens <= 0:
        v.missing("e2e tokens missing (the greedy tokens compared)")
        return
    if not isinstance(prompts, int) or isinstance(prompts, bool) or prompts <= 0:
        v.missing("e2e prompts missing")
    if not isinstance(divergences, list):
        v.missing("e2e divergences missing (an empty list when every token matched)")
        return
    k = int(t["e2e_top_k"])
    hard = 0
    for d in divergences:
        if not isinstance(d, Mapping):
            v.missing("e2e: a divergence is not an object")
            return
        ref_list, target_list = d.get("ref_top5") or [], d.get("target_top5") or []
        ref_top = _token_ids(ref_list[:k] if isinstance(ref_list, list) else [])
        target_top = _token_ids(target_list[:k] if isinstance(target_list, list) else [])
        near_tie = d.get("target_token") in ref_top and d.get("ref_token") in target_top
        if not near_tie:
            hard += 1
            if hard == 1:
                v.fail(f"e2e prompt {d.get('prompt')} position {d.get('position')}: target token "
                       f"{d.get('target_token')} vs reference {d.get('ref_token')} is not within each other's top-{k}"
                       + (" (claimed a near-tie)" if d.get("near_tie") else ""))
    if hard > 1:
        v.fail(f"e2e: {hard} divergences beyond a near-tie")
    recomputed = 1 - len(divergences) / tokens
    claimed_rate = _number(e2e.get("token_match_rate"))
    if claimed_rate is None:
        v.missing("e2e token_match_rate missing")
    elif claimed_rate > recomputed + 1e-9:
        v.fail(f"e2e token_match_rate {claimed_rate:.4f} is above the {recomputed:.4f} recomputed from "
               f"{len(divergences)} divergences over {tokens} tokens")
    else:
        unrecorded = round((1 - claimed_rate) * tokens) - len(divergences)
        if unrecorded > 0:
            claimed_hard = e2e.get("hard_divergences")
            if not isinstance(claimed_hard, int) or isinstance(claimed_hard, bool):
                v.missing(f"e2e: {unrecorded} divergent steps are not recorded and hard_divergences is missing")
            elif claimed_hard > hard:
                v.fail(f"e2e: {claimed_hard} divergences beyond a near-tie")
            else:
                v.note(f"e2e: {unrecorded} divergent steps not recorded; judged on the recorded ones")
    ppl_ref, ppl_target = _number(e2e.get("perplexity_ref")), _number(e2e.get("perplexity_target"))
    if ppl_ref is None or ppl_target is None or ppl_ref <= 0:
        v.missing("e2e perplexity_ref and perplexity_target missing")
    else:
        rel = abs(ppl_target - ppl_ref) / ppl_ref
        if rel > t["perplexity_rel_tol"]:
            v.fail(f"e2e perplexity {_text(ppl_target)} vs reference {_text(ppl_ref)} differs by {rel:.4f}, above "
                   f"{_text(t['perplexity_rel_tol'])}")


def _kv(v: Verdict, kv: Any, t: Mapping[str, float], ctx: Context) -> None:
    if not isinstance(kv, Mapping) or not kv:
        v.missing("kv_cache missing")
        return
    lengths = kv.get("lengths")
    if kv.get("path") == "recompute" and lengths == [] and ctx.model.runtime_path == "fallback":
        v.note("kv_cache: the fallback path recomputes every step; no paged cache to check")
        return
    if not isinstance(lengths, list) or not lengths or not all(
            isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in lengths):
        v.missing("kv_cache lengths missing (the sequence lengths checked)")
        return
    context = ctx.model.context_length
    if context and max(lengths) > context:
        v.fail(f"kv_cache length {max(lengths)} is beyond the model's context {context}")
    err = _number(kv.get("max_abs_err"))
    if err is None:
        v.missing("kv_cache max_abs_err missing")
    elif err > t["kv_cache_max_abs_err"]:
        v.fail(f"kv_cache max_abs_err {_text(err)} is above {_text(t['kv_cache_max_abs_err'])}")


def _align(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    _align_rows(v, s.get("ops"), "ops", "op", "op_cosine", "op_max_rel_err", t)
    layers = s.get("layers")
    _align_rows(v, layers, "layers", "layer", "layer_cosine", "layer_max_rel_err", t)
    config = ctx.model.config or {}
    declared = config.get("num_hidden_layers") or (config.get("text_config") or {}).get("num_hidden_layers")
    if isinstance(layers, list) and layers and isinstance(declared, int) and len(layers) != declared:
        v.fail(f"layers: {len(layers)} compared, the model has {declared}")
    _e2e(v, s.get("e2e"), t)
    _kv(v, s.get("kv_cache"), t, ctx)
    for part, error in (s.get("part_errors") or {}).items() if isinstance(s.get("part_errors"), Mapping) else ():
        v.fail(f"the {part} check could not run ({error})")


# --- serve -----------------------------------------------------------------------------------------------

def _serve(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    checks = s.get("checks") if isinstance(s.get("checks"), list) else []
    failed_checks = [c.get("name") for c in checks if isinstance(c, Mapping) and c.get("ok") is False]
    if s.get("text_path_ok") is not True:
        v.missing("text path not answered") if s.get("text_path_ok") is None else v.fail("text path failed")
    has_template = ctx.model.has_chat_template or s.get("has_chat_template") is True
    if has_template:
        if s.get("chat_path_ok") is None:
            v.missing("chat path not exercised although the model has a chat template")
        elif s.get("chat_path_ok") is not True:
            v.fail("chat path failed")
    if ctx.model.takes_images:
        if s.get("image_path_ok") is None:
            v.missing("image path not exercised although the model takes images")
        elif s.get("image_path_ok") is not True:
            v.fail("image path failed")
    if failed_checks:
        v.fail(f"checks failed: {', '.join(map(str, failed_checks))}")


# --- bench -----------------------------------------------------------------------------------------------

def _bench(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    runs = s.get("runs")
    if not isinstance(runs, list) or not runs:
        v.missing("runs missing")
        return
    levels = set()
    for i, run in enumerate(runs):
        if not isinstance(run, Mapping):
            v.missing(f"run {i} is not an object")
            continue
        c = run.get("concurrency")
        where = f"run at concurrency {c}"
        levels.add(c)
        stats: dict[str, dict[str, float | None]] = {}
        for metric in LATENCY_METRICS:
            block = run.get(metric)
            if not isinstance(block, Mapping):
                v.missing(f"{where}: {metric} missing")
                continue
            stats[metric] = {p: _number(block.get(p)) for p in ("mean", *PERCENTILES)}
            if any(stats[metric][p] is None for p in PERCENTILES):
                v.missing(f"{where}: {metric} percentiles p50/p90/p99 missing")
                continue
            p50, p90, p99 = (stats[metric][p] for p in PERCENTILES)
            if min(p50, p90, p99) < 0:
                v.fail(f"{where}: {metric} has a negative percentile")
            if not p50 <= p90 <= p99:
                v.fail(f"{where}: {metric} percentiles are not ordered (p50 {_text(p50)}, p90 {_text(p90)}, "
                       f"p99 {_text(p99)})")
        tpot, e2e = stats.get("tpot_ms", {}), stats.get("e2e_ms", {})
        for p in ("mean", "p50"):
            if tpot.get(p) is not None and e2e.get(p) is not None and tpot[p] > e2e[p]:
                v.fail(f"{where}: TPOT {p} {_text(tpot[p])} ms exceeds end-to-end {p} {_text(e2e[p])} ms")
        tok_s = _number(run.get("output_tok_s"))
        if tok_s is None:
            v.missing(f"{where}: output_tok_s missing")
        elif tok_s <= 0:
            v.fail(f"{where} produced no output tokens")
        failed = run.get("failed")
        if not isinstance(failed, int) or isinstance(failed, bool) or failed < 0:
            v.missing(f"{where}: failed (the count of failed requests) missing")
            continue
        completed = run.get("completed")
        total = failed + completed if isinstance(completed, int) and not isinstance(completed, bool) else None
        limit = t["bench_max_failure_ratio"]
        if failed and (total is None or failed / total > limit):
            ratio = f" of {total}" if total else ""
            v.fail(f"{where} has {failed}{ratio} failed requests" + (f" (above {limit:g})" if limit else ""))
    wanted = int(t["bench_min_concurrency_levels"])
    if len(levels) < wanted:
        v.fail(f"{len(levels)} concurrency level(s), a baseline sweeps at least {wanted}")


# --- eval ------------------------------------------------------------------------------------------------

def _grid_rows(grid: Any) -> list[list[float]] | None:
    """An accuracy grid [length][depth] (or one accuracy per length) as rows of numbers; None if malformed."""
    if not isinstance(grid, list) or not grid:
        return None
    rows = []
    for row in grid:
        values = row if isinstance(row, list) else [row]
        numbers = [_number(x) for x in values]
        if not numbers or any(n is None for n in numbers):
            return None
        rows.append(numbers)
    return rows


def _eval(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    tasks = s.get("tasks")
    rtol = t["eval_rtol"]
    if not isinstance(tasks, list) or not tasks:
        v.missing("tasks missing ([{task, metric, reference, target, n}])")
    else:
        for row in tasks:
            name = row.get("task") if isinstance(row, Mapping) else None
            ref = _number(row.get("reference")) if isinstance(row, Mapping) else None
            target = _number(row.get("target")) if isinstance(row, Mapping) else None
            if ref is None or target is None:
                v.missing(f"task {name}: reference and target scores missing")
                continue
            metric = str(row.get("metric") or "")
            task_rtol = rtol
            if _number(row.get("rtol")) is not None and row["rtol"] != rtol:
                v.note(f"task {name}: its own rtol {row['rtol']} ignored; the job's is {rtol:g}")
            if any(word in metric.lower() for word in LOWER_IS_BETTER):
                if target > ref * (1 + task_rtol):
                    v.fail(f"task {name} {metric} {_text(target)} is above reference {_text(ref)} × (1 + {task_rtol:g})")
            elif target < ref * (1 - task_rtol):
                v.fail(f"task {name} {metric or 'score'} {_text(target)} is below reference {_text(ref)} × "
                       f"(1 − {task_rtol:g})")
    needle = s.get("needle")
    if not isinstance(needle, Mapping) or not needle:
        v.missing("needle missing (lengths, depths, reference, target)")
        return
    lengths = needle.get("lengths")
    ref_rows, target_rows = _grid_rows(needle.get("reference")), _grid_rows(needle.get("target"))
    if not isinstance(lengths, list) or not lengths or ref_rows is None or target_rows is None:
        v.missing("needle lengths, reference and target accuracies missing")
        return
    if not (len(lengths) == len(ref_rows) == len(target_rows)):
        v.missing(f"needle: {len(lengths)} lengths but {len(ref_rows)} reference and {len(target_rows)} target rows")
        return
    context = ctx.model.context_length
    for length, ref_row, target_row in zip(lengths, ref_rows, target_rows, strict=True):
        if context and isinstance(length, int) and length > context:
            v.fail(f"needle length {length} is beyond the model's context {context}")
        ref_acc, target_acc = sum(ref_row) / len(ref_row), sum(target_row) / len(target_row)
        if target_acc + 1e-9 < ref_acc:
            v.fail(f"needle at length {length}: accuracy {target_acc:.3f} is below the reference's {ref_acc:.3f}")


def _no_rule(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    """inventory, env, comm, soak gate no tier: a section is enough."""


RULES: dict[str, Callable[[Verdict, Mapping[str, Any], Mapping[str, float], Context], None]] = {
    "plan": _plan, "load": _load, "align": _align, "serve": _serve, "bench": _bench, "eval": _eval,
}


def judge(stage: str, section: Mapping[str, Any] | None, overrides: Mapping[str, Any] | None = None,
          context: Context | None = None) -> Verdict:
    """The verdict on one stage's section with a job's threshold ``overrides`` merged over the versioned
    defaults. A missing section is incomplete."""
    verdict = Verdict(stage=stage, custom_thresholds=th.looser_keys(overrides))
    if not isinstance(section, Mapping):
        verdict.missing("no section")
        return verdict
    rule = RULES.get(stage, _no_rule)
    try:
        rule(verdict, section, th.merged(overrides), context or Context())
    except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a malformed section, never a crash
        verdict.missing(f"malformed section ({type(exc).__name__}: {exc})")
    error = section.get("error")
    if verdict.status == PASS and isinstance(error, str) and error:
        verdict.fail(f"the stage reported an error: {error[:300]}")
    return verdict
