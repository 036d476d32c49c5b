"""The ``conformance`` verdict: every check row's pass recomputed from its ``target`` and ``reference``
(the row's own ``passed`` is a claim, never read), and every check the model owes present
(``contract.conformance.required_checks``). Whether the model's template declares tools is the portal's fact
where it has one (``ModelFacts.template_declares_tools``): a section that says otherwise cannot drop the tool
checks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from contract.conformance import ALL_CHECKS, required_checks
from contract.verdicts.base import Context, Verdict
from contract.verdicts.base import number as _number

MAX_ROWS = 64  # a section is a dozen rows; more is not a conformance section
ERROR_KEYS = ("message", "type")


def _count(value: Any, key: str) -> int | None:
    n = _number(value.get(key)) if isinstance(value, Mapping) else None
    return int(n) if n is not None and n >= 0 and float(n).is_integer() else None


def _ratio(target: Any, ok_key: str, of_key: str, floor: float, what: str) -> str | None:
    ok, total = _count(target, ok_key), _count(target, of_key)
    if ok is None or total is None or ok > total:
        return f"target must be {{{ok_key}, {of_key}}} counts with {ok_key} ≤ {of_key}"
    if total == 0:
        return f"no {what} were made"
    if ok / total + 1e-12 < floor:
        return f"{ok} of {total} {what} valid ({ok / total:.3f}, at least {floor:g})"
    return None


def _trigger(target: Any, reference: Any, t: Mapping[str, float]) -> str | None:
    if not (isinstance(target, list) and isinstance(reference, list) and target and len(target) == len(reference)
            and all(isinstance(x, bool) for x in target + reference)):
        return "target and reference must be equally long, non-empty lists of true/false (a call made or not)"
    agree = sum(a == b for a, b in zip(target, reference, strict=True)) / len(target)
    floor = t["conformance_min_trigger_agreement"]
    if agree + 1e-12 < floor:
        return f"trigger agreement {agree:.3f} over {len(target)} prompts (at least {floor:g})"
    return None


def _arguments(target: Any, reference: Any, t: Mapping[str, float]) -> str | None:
    calls = _count(target, "calls")
    if calls == 0 and _count(target, "valid") == 0:
        ref_calls = _count(reference, "calls")
        return f"no unforced call made where the reference made {ref_calls}" if ref_calls else None
    return _ratio(target, "valid", "calls", t["conformance_min_arguments_valid"], "unforced calls")


def _forced(target: Any, reference: Any, t: Mapping[str, float]) -> str | None:
    return _ratio(target, "valid", "requests", t["conformance_min_forced_valid"], "forced-call requests")


def _schema(target: Any, reference: Any, t: Mapping[str, float]) -> str | None:
    return _ratio(target, "valid", "requests", t["conformance_min_schema_valid"], "json_schema answers")


def _stream(target: Any, reference: Any, t: Mapping[str, float]) -> str | None:
    if not isinstance(target, list) or not target or not all(isinstance(p, Mapping) for p in target):
        return "target must be a non-empty list of {whole, streamed} messages"
    differ = [i for i, p in enumerate(target) if p.get("whole") is None or p.get("whole") != p.get("streamed")]
    return f"streamed differs from non-streamed at pair(s) {differ[:10]} of {len(target)}" if differ else None


def _equal_lists(target: Any, reference: Any, what: str) -> str | None:
    if not isinstance(target, list) or not isinstance(reference, list) or not target:
        return f"target and reference must be non-empty lists of {what}"
    if len(target) != len(reference):
        return f"{len(target)} target and {len(reference)} reference {what}"
    differ = [i for i, (a, b) in enumerate(zip(target, reference, strict=True)) if a != b or a is None]
    return f"{what} differ at {differ[:10]} (target {target[differ[0]]!r:.80}, reference {reference[differ[0]]!r:.80})" \
        if differ else None


def _prompt_tokens(target: Any, reference: Any, t: Mapping[str, float]) -> str | None:
    if isinstance(target, list) and not all(_count({"n": x}, "n") is not None for x in target):
        return "target must be a list of prompt token counts"
    return _equal_lists(target, reference, "prompt token counts")


def _stop(target: Any, reference: Any, t: Mapping[str, float]) -> str | None:
    if isinstance(target, list) and not all(isinstance(x, str) for x in target):
        return "target must be a list of texts"
    return _equal_lists(target, reference, "texts cut at the stop sequence")


def _n(target: Any, reference: Any, t: Mapping[str, float]) -> str | None:
    got, asked = _count({"n": target}, "n"), _count({"n": reference}, "n")
    if got is None or asked is None or asked < 2:
        return "target (choices returned) and reference (n asked, at least 2) must be counts"
    return None if got == asked else f"{got} choices returned for n={asked}"


def _seed(target: Any, reference: Any, t: Mapping[str, float]) -> str | None:
    if not isinstance(target, list) or len(target) < 2 or not all(isinstance(x, str) for x in target):
        return "target must be at least two texts sampled with the same seed"
    return None if len(set(target)) == 1 else f"{len(set(target))} different texts from {len(target)} runs with one seed"


def _max_tokens(target: Any, reference: Any, t: Mapping[str, float]) -> str | None:
    if not (isinstance(target, list) and isinstance(reference, list) and target and len(target) == len(reference)
            and all(_count({"n": x}, "n") is not None for x in target + reference)):
        return "target (completion tokens) and reference (max_tokens asked) must be equally long lists of counts"
    over = [(a, b) for a, b in zip(target, reference, strict=True) if a > b]
    return f"completion tokens above max_tokens: {over[:5]}" if over else None


def _errors(target: Any, reference: Any, t: Mapping[str, float]) -> str | None:
    if not isinstance(target, list) or not target or not all(isinstance(r, Mapping) for r in target):
        return "target must be a non-empty list of {case, status, error_keys}"
    bad = [r.get("case") for r in target if r.get("status") != 400 or not isinstance(r.get("error_keys"), list)
           or not all(k in r["error_keys"] for k in ERROR_KEYS)]
    return f"not a 400 with {{error: {{message, type}}}}: {bad[:10]}" if bad else None


def _reasoning(target: Any, reference: Any, t: Mapping[str, float]) -> str | None:
    leaks, responses = _count(target, "leaks"), _count(target, "responses")
    if leaks is None or responses is None or leaks > responses:
        return "target must be {leaks, responses} counts with leaks ≤ responses"
    if responses == 0:
        return "no thinking responses were checked"
    return f"reasoning in content in {leaks} of {responses} responses" if leaks else None


RULES: dict[str, Callable[[Any, Any, Mapping[str, float]], str | None]] = {
    "tool_trigger_agreement": _trigger, "tool_arguments_valid": _arguments, "forced_calls_valid": _forced,
    "json_schema_valid": _schema, "stream_equals_whole": _stream, "prompt_tokens": _prompt_tokens,
    "stop_honoured": _stop, "n_honoured": _n, "seed_determinism": _seed, "max_tokens_honoured": _max_tokens,
    "error_shape": _errors, "reasoning_not_in_content": _reasoning,
}
assert set(RULES) == set(ALL_CHECKS)


def row_failure(row: Mapping[str, Any], t: Mapping[str, float]) -> str | None:
    """Why a check row fails, recomputed from its target and reference; None when it passes."""
    rule = RULES.get(str(row.get("check")))
    if rule is None:
        return f"unknown check {str(row.get('check'))[:60]!r}"
    return rule(row.get("target"), row.get("reference"), t)


def judge(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float], ctx: Context) -> None:
    """The conformance verdict (``contract.verdicts.RULES['conformance']``)."""
    rows = s.get("checks")
    if not isinstance(rows, list) or not rows:
        v.missing("checks missing ([{check, passed, detail, target, reference}])")
        return
    if len(rows) > MAX_ROWS:
        v.fail(f"{len(rows)} check rows (at most {MAX_ROWS})")
        return
    repeats, asked = _count(s, "repeats"), int(t["conformance_repeats"])
    if repeats is None or repeats < asked:
        v.fail(f"the prompt set was sent {s.get('repeats')!s:.20} time(s), the job asks {asked} "
               "(threshold conformance_repeats)")
    known = ctx.model.template_declares_tools
    tools = known if known is not None else s.get("template_declares_tools") is True
    if known and s.get("template_declares_tools") is not True:
        v.fail("the model's chat template declares tools (the portal's fact), the section says it does not")
    by_check: dict[str, Mapping[str, Any]] = {}
    for row in rows:
        if isinstance(row, Mapping) and isinstance(row.get("check"), str):
            if row["check"] in by_check:
                v.fail(f"check {row['check']} reported twice")
            by_check[row["check"]] = row
    for name in required_checks(tools, s.get("thinking") is True):
        if name not in by_check:
            v.missing(f"check {name} missing")
    for name, row in by_check.items():
        why = row_failure(row, t)
        if why is not None:
            v.fail(f"{name}: {why}")
        elif row.get("passed") is False:
            v.note(f"{name}: the agent reported a failure its rows do not show")
