"""Stage verdicts: whether a stage's report section is passing evidence, judged from the numbers in it.

One pure module (no Django, no torch) that the pipeline runs to say what it claims and the portal runs to
judge what an agent posted. The agent's own flags (``passed``, ``ok``, ``fits`` …) are never read as
evidence: ``claimed`` returns them so the portal can store them as claims beside its verdict.

A verdict is ``pass``, ``fail`` (the numbers are outside a threshold, or contradict each other) or
``incomplete`` (the section lacks what the rule needs: never passing). Its reasons are sentences naming the
part ("align: kv_cache missing", "bench: run at concurrency 4 has 99 failed requests")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from contract import thresholds as th
from contract.verdicts import acting as _acting
from contract.verdicts import conformance as _conformance
from contract.verdicts.align import _align
from contract.verdicts.base import (  # noqa: F401 (re-exported: the module's public names)
    CLAIM_KEYS,
    FAIL,
    HIGHER_IS_BETTER,
    INCOMPLETE,
    LATENCY_METRICS,
    LOWER_IS_BETTER,
    PASS,
    PERCENTILES,
    Context,
    HardwareFacts,
    ModelFacts,
    Verdict,
    claimed,
)
from contract.verdicts.base import number as _number
from contract.verdicts.base import text as _text
from contract.verdicts.bench import _bench
from contract.verdicts.load import _load

# --- plan ------------------------------------------------------------------------------------------------

# A claimed memory need per device may differ from the portal's recomputation by this factor (another runtime
# version's activation estimate), not by orders of magnitude; and no device holds more than 1 PiB.
PLAN_BYTES_FACTOR = 2.0
MAX_DEVICE_BYTES = float(1 << 50)


def _claimed_bytes(v: Verdict, s: Mapping[str, Any]) -> float | None:
    """The section's ``bytes_per_device`` when it is a number; fails the plan when it cannot be a memory need."""
    raw = s.get("bytes_per_device")
    if raw is None:
        return None
    per_device = _number(raw)
    if per_device is None or not 0 < per_device <= MAX_DEVICE_BYTES:
        v.fail(f"bytes_per_device {_text(raw)} is not a memory need per device (a number above 0 and at most "
               f"{int(MAX_DEVICE_BYTES)} (2**50))")
        return None
    return per_device


def _plan(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    plan = s.get("plan")
    if not isinstance(plan, Mapping) or not plan:
        v.missing("plan missing (tp, pp, ep, devices)")
        return
    degrees = {k: plan.get(k) for k in ("tp", "pp", "ep")}
    if not all(isinstance(d, int) and not isinstance(d, bool) and 1 <= d <= 1 << 16 for d in degrees.values()):
        v.missing(f"plan degrees must be integers from 1 to 65536, got tp={degrees['tp']} pp={degrees['pp']} "
                  f"ep={degrees['ep']}")
        return
    config = ctx.model.config
    if ctx.hardware is None or not config:
        # no hardware or config to recompute with (a standalone run): the section's own numbers must agree
        if s.get("bytes_per_device") is not None and _claimed_bytes(v, s) is None:
            return
        per_device, memory = _number(s.get("bytes_per_device")), _number(s.get("memory_per_device"))
        if per_device is None or memory is None:
            v.missing("bytes_per_device and memory_per_device are needed to judge the plan without the hardware")
        elif per_device > memory:
            v.fail(f"needs {int(per_device)} bytes per device, the device has {int(memory)}")
        v.note("fits judged from the section's own bytes (no hardware facts to recompute with)")
        return
    planner = ctx.planner
    if planner is None:
        from contract.planner import plan_report as planner
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
    claimed_bytes, recomputed = _claimed_bytes(v, s), _number(report.get("bytes_per_device"))
    if claimed_bytes is not None and recomputed and not (
            recomputed / PLAN_BYTES_FACTOR <= claimed_bytes <= recomputed * PLAN_BYTES_FACTOR):
        v.fail(f"the plan claims {int(claimed_bytes)} bytes per device, the portal's planner recomputes "
               f"{int(recomputed)} for tp={degrees['tp']} pp={degrees['pp']} ep={degrees['ep']} at {dtype} "
               f"(more than {PLAN_BYTES_FACTOR:g}× apart)")


# --- serve -----------------------------------------------------------------------------------------------

def _serve(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    checks = s.get("checks") if isinstance(s.get("checks"), list) else []
    failed_checks = [c.get("name") for c in checks if isinstance(c, Mapping) and c.get("ok") is False]
    ready = _number(s.get("ready_seconds"))
    if ready is None or ready < 0 or not isinstance(s.get("endpoint"), str) or not s.get("endpoint"):
        v.missing("ready_seconds and endpoint missing (the server was never shown ready)")
    if s.get("text_path_ok") is not True:
        v.missing("text path not answered") if s.get("text_path_ok") is None else v.fail("text path failed")
    # the model's facts, or the serve stage's own finding (``chat_template``: where the template was found)
    has_template = ctx.model.has_chat_template or s.get("has_chat_template") is True or bool(s.get("chat_template"))
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
    if ctx.challenge is not None:  # the portal: its scores of the raw outputs; tasks and needle stay claims
        ctx.challenge(v, "eval", s, t)
        return
    v.note("judged from the agent's own numbers: no portal reference")
    _acting.judge(v, s, t)
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
            lower = any(word in metric.lower() for word in LOWER_IS_BETTER)
            if not lower and not any(word in metric.lower() for word in HIGHER_IS_BETTER):
                lower = row.get("higher_is_better") is False  # a metric the judge does not know: its own word
            if lower:
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
    """inventory, env, comm gate no tier: a section is enough."""


# soak: the portal's own limits, recomputed from the windows; it gates no tier
SOAK_MIN_THROUGHPUT_RATIO = 0.95
SOAK_MAX_MEMORY_SLOPE = 1024.0 * 1024.0  # bytes/s of the final server process
SOAK_MAX_RECOVER_SECONDS = 180.0


def _soak(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    windows = [w for w in (s.get("windows") or []) if isinstance(w, Mapping) and not w.get("outage")]
    rates = [_number(w.get("output_tok_s")) for w in windows]
    if len(rates) < 2 or rates[0] is None or rates[-1] is None or rates[0] <= 0:
        v.missing("fewer than two windows with throughput")
    elif rates[-1] < rates[0] * SOAK_MIN_THROUGHPUT_RATIO:
        v.fail(f"last window's throughput {rates[-1]:.1f} tok/s is below {SOAK_MIN_THROUGHPUT_RATIO:.0%} of the "
               f"first's {rates[0]:.1f}")
    slope = _number(s.get("memory_slope"))
    if slope is None:
        v.missing("memory_slope missing")
    elif slope > SOAK_MAX_MEMORY_SLOPE:
        v.fail(f"memory grows {slope / 1024:.0f} KiB/s (at most {SOAK_MAX_MEMORY_SLOPE / 1024:.0f})")
    crashes = _number(s.get("crashes"))
    if crashes is None:
        v.missing("crashes missing")
    elif crashes > 0:
        v.fail(f"{crashes:.0f} crash(es) besides the injected failure")
    recover = _number(s.get("recover_seconds"))
    if recover is None:
        v.fail("the server did not recover from the injected failure (no recover_seconds)")
    elif recover > SOAK_MAX_RECOVER_SECONDS:
        v.fail(f"recovery took {recover:.0f} s (at most {SOAK_MAX_RECOVER_SECONDS:.0f})")


RULES: dict[str, Callable[[Verdict, Mapping[str, Any], Mapping[str, float], Context], None]] = {
    "plan": _plan, "load": _load, "align": _align, "serve": _serve, "bench": _bench, "eval": _eval, "soak": _soak,
    "conformance": _conformance.judge,
}


def judge(stage: str, section: Mapping[str, Any] | None, overrides: Mapping[str, Any] | None = None,
          context: Context | None = None) -> Verdict:
    """The verdict on one stage's section with a job's threshold ``overrides`` merged over the versioned
    defaults. A missing section is incomplete."""
    verdict = Verdict(stage=stage, custom_thresholds=th.looser_keys(overrides))
    if not isinstance(section, Mapping):
        verdict.missing("no section")
        return verdict
    if section.get("applicable") is False:  # an external engine's internals (contract.engines, docs/engines.md)
        verdict.missing(f"{stage} not applicable ({_text(section.get('reason'))[:200]}): never passing evidence; "
                        "for an external engine no tier is reached through it")
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


def judge_stages(stages: Mapping[str, Mapping[str, Any]], overrides: Mapping[str, Any] | None = None,
                 context: Context | None = None) -> dict[str, Verdict]:
    """Verdicts of every section of a report's ``stages`` mapping."""
    return {stage: judge(stage, section, overrides, context) for stage, section in stages.items()}
