"""The eval verdict's acting tasks (``eval.code``: humaneval, ``eval.agent``: agent_kv), judged from the
per-item rows the agent sent, not from its summary numbers: pass@1 and success rates are recomputed here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from contract.verdicts.base import Verdict


def _rate(rows: list[Any], side: str) -> float | None:
    values = [row.get(side) for row in rows if isinstance(row, Mapping)]
    if not values or len(values) != len(rows) or not all(isinstance(x, bool) for x in values):
        return None
    return sum(values) / len(values)


def judge(v: Verdict, s: Mapping[str, Any], t: Mapping[str, float]) -> None:
    """Fail when the target's pass@1 / success falls below the reference's by more than the job's tolerance, or
    the agent's turn agreement is under its minimum; a section whose rows are malformed is missing."""
    code = s.get("code")
    if isinstance(code, Mapping):
        rows = code.get("per_item")
        ref = _rate(rows, "reference") if isinstance(rows, list) else None
        tgt = _rate(rows, "target") if isinstance(rows, list) else None
        if ref is None or tgt is None:
            v.missing("code: per_item rows with boolean reference and target missing")
        else:
            if tgt + 1e-9 < ref - t["eval_code_pass_tol"]:
                v.fail(f"task humaneval pass@1 {tgt:.3g} is below reference {ref:.3g} − {t['eval_code_pass_tol']:g}")
            for row in rows:  # the same program (by hash) cannot both pass and fail
                ref_hash, tgt_hash = row.get("reference_sha256"), row.get("target_sha256")
                if ref_hash and ref_hash == tgt_hash and row["reference"] != row["target"]:
                    v.fail(f"task humaneval {row.get('task_id')}: the same completion (sha256 {str(ref_hash)[:12]}) "
                           "is reported passing on one side and failing on the other")
    agent = s.get("agent")
    if isinstance(agent, Mapping):
        rows = agent.get("per_episode")
        ref = _rate(rows, "reference") if isinstance(rows, list) else None
        tgt = _rate(rows, "target") if isinstance(rows, list) else None
        agreement = agent.get("turn_agreement")
        if ref is None or tgt is None or not isinstance(agreement, int | float) or isinstance(agreement, bool):
            v.missing("agent: per_episode rows with boolean reference and target, and turn_agreement, missing")
            return
        if tgt + 1e-9 < ref - t["eval_agent_success_tol"]:
            v.fail(f"task agent_kv success {tgt:.3g} is below reference {ref:.3g} − {t['eval_agent_success_tol']:g}")
        if agreement + 1e-9 < t["eval_agent_min_turn_agreement"]:
            v.fail(f"task agent_kv turn agreement {agreement:.3g} is below {t['eval_agent_min_turn_agreement']:g}")
