"""The newest conformance section of a cell as the cell page and the cell API show it: one row per check with
the target beside the reference, each row's pass recomputed by the portal (``contract.verdicts.conformance``,
at the job's thresholds over the defaults) beside the agent's own claim. One query (only the section's keys
shown are read)."""

from __future__ import annotations

import json
from typing import Any

from apps.evidence.models import StageResult
from contract import thresholds as th
from contract.verdicts.conformance import row_failure

MAX_SHOWN = 400  # characters of a target or reference value shown in a row (the JSON export keeps them whole)


def _shown(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)
    return text if len(text) <= MAX_SHOWN else text[:MAX_SHOWN] + "…"


def conformance_evidence(result: StageResult | None) -> dict[str, Any] | None:
    """``{job, verdict, template_declares_tools, thinking, tool_call_parser, reasoning_parser, repeats, rows}``
    (rows: ``{check, passed, claimed, detail, target, reference}``), or None without a conformance section."""
    if result is None:
        return None
    row = StageResult.objects.filter(pk=result.pk).values_list(
        "section__checks", "section__template_declares_tools", "section__thinking", "section__tool_call_parser",
        "section__reasoning_parser", "section__repeats", "job__spec").first()
    if row is None:
        return None
    checks, tools, thinking, parser, reasoning, repeats, spec = row
    overrides = (spec or {}).get("thresholds") if isinstance(spec, dict) else None
    t = th.merged(overrides if isinstance(overrides, dict) else None)
    rows = []
    for check in checks if isinstance(checks, list) else []:
        if not isinstance(check, dict):
            continue
        why = row_failure(check, t)
        rows.append({"check": str(check.get("check"))[:64], "passed": why is None,
                     "claimed": check.get("passed") if isinstance(check.get("passed"), bool) else None,
                     "detail": why or str(check.get("detail") or "")[:500],
                     "target": _shown(check.get("target")), "reference": _shown(check.get("reference"))})
    return {"job": result.job_id, "verdict": result.verdict, "template_declares_tools": tools is True,
            "thinking": thinking is True, "tool_call_parser": parser if isinstance(parser, str) else None,
            "reasoning_parser": reasoning if isinstance(reasoning, str) else None,
            "repeats": repeats if isinstance(repeats, int) else None, "rows": rows}
