"""The align verdict of an external engine (docs/engines.md): endpoint align replaces operator and layer align,
which read internals an external engine does not expose. It is end to end through the endpoint (the portal's
scores of the raw challenge outputs; a standalone run: the agent's fixed-prompt numbers) plus the KV-cache
self-consistency check, every KL recomputed here from the rows (``contract.endpoint_align``). A section claiming
endpoint align for the bundled runtime, or an external engine's align section of another form, gains nothing.
Pure: no Django, no torch."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from contract.endpoint_align import (
    AGREEING_CASES,
    CASES,
    METHOD,
    NOOP_CASE,
    NOOP_MAX_KL,
    PERTURBED_CASE,
    perturbed_floor,
    row_kl,
)
from contract.engines import DEFAULT_ENGINE
from contract.verdicts.base import Context, Verdict
from contract.verdicts.base import number as _number


def external(ctx: Context) -> bool:
    """Whether the job ran an external engine (the context's ``engine`` names one other than the bundled)."""
    return bool(ctx.engine) and ctx.engine != DEFAULT_ENGINE


def judge_endpoint_align(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context,
                         e2e_rule: Callable[[Verdict, Any, Mapping[str, float]], None]) -> None:
    """Endpoint align: the engine's e2e and ``kv_self``; incomplete for the bundled runtime or another form."""
    if not external(ctx):
        v.missing("endpoint align (method 'endpoint') is an external engine's align; this job runs the bundled "
                  "runtime, whose align needs ops, layers, e2e and kv_cache")
        return
    if s.get("method") != METHOD:
        v.missing(f"an external engine ({ctx.engine}) is aligned through its endpoint: method 'endpoint' with e2e "
                  "and kv_self; operator and layer align cannot see inside it")
        return
    if ctx.challenge is not None:  # the portal: its scores of the engine's raw outputs against its reference
        ctx.challenge(v, "align", s, t)
    else:
        v.note("e2e: judged from the agent's own numbers: no portal reference")
        e2e_rule(v, s.get("e2e"), t)
    _kv_self(v, s.get("kv_self"), t)
    for part, error in (s.get("part_errors") or {}).items() if isinstance(s.get("part_errors"), Mapping) else ():
        v.fail(f"the {part} check could not run ({error})")
    v.note(f"endpoint align of engine {ctx.engine}: operator and layer align are not applicable, replaced by "
           "end-to-end align and the KV-cache self-consistency check")


def _kv_self(v: Verdict, kv: Any, t: Mapping[str, float]) -> None:
    if not isinstance(kv, Mapping) or not isinstance(kv.get("rows"), list) or not kv["rows"]:
        v.missing("kv_self missing (the KV-cache self-consistency rows)")
        return
    bound = float(t["kv_self_max_mean_kl"])
    by_case: dict[str, list[Mapping[str, Any]]] = {}
    for row in kv["rows"]:
        if isinstance(row, Mapping) and row.get("case") in CASES:
            by_case.setdefault(str(row["case"]), []).append(row)
    absent = [case for case in CASES if case not in by_case]
    if absent:
        v.missing(f"kv_self: no {', '.join(absent)} row (miss, hit, hit_vs_miss, noop and perturbed are all needed)")
        return
    means: dict[int, float] = {}
    for case, rows in by_case.items():
        for row in rows:
            kl = row_kl(row.get("decoded"), row.get("prefilled"))
            if kl is None:
                v.missing(f"kv_self {case}: decoded and prefilled top-k logprobs missing or malformed")
            else:
                means[id(row)] = kl[0]
    floor = perturbed_floor(means.get(id(by_case["miss"][0])))
    for case, rows in by_case.items():
        for row in rows:
            if id(row) not in means:
                continue
            mean = means[id(row)]
            claimed = _number(row.get("mean_kl"))
            if claimed is not None and abs(claimed - mean) > 1e-6 + 1e-3 * mean:
                v.fail(f"kv_self {case}: claimed mean KL {claimed:.6g}, recomputed {mean:.6g} from its rows")
            if case in AGREEING_CASES and mean > bound:
                v.fail(f"kv_self {case}: mean top-k KL {mean:.4g} between decoded and prefilled logprobs is above "
                       f"{bound:g} (the KV cache changes what the engine computes)")
            elif case == NOOP_CASE and (mean > NOOP_MAX_KL or row.get("decoded") != row.get("prefilled")):
                v.fail(f"kv_self no-op control: a run compared with itself gives mean KL {mean:.3g}, not 0")
            elif case == PERTURBED_CASE and mean <= floor:
                v.fail(f"kv_self perturbed prompt: mean KL {mean:.4g} is not above {floor:.3g} (a floor, and ten "
                       "times the miss case's): the check cannot see a difference")
    noop, miss = by_case[NOOP_CASE][0], by_case["miss"][0]
    if noop.get("decoded") != miss.get("decoded"):
        v.fail("kv_self no-op control: not the miss decode compared with itself")
