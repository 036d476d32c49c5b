"""What the portal hands an agent from its references, read at dispatch: a certify attempt's challenge (inputs
only), and the whole pool for a reference job on reference hardware. Reference outputs and answers are never
part of either."""

from __future__ import annotations

from typing import Any

from apps.jobs.choices import JobPurpose
from apps.jobs.models import Job
from apps.references.models import Challenge, ReferenceRun
from contract.challenges import pool as cp


def payload_for(job: Job) -> dict[str, Any]:
    """The payload keys of ``job``: ``challenge`` for a certify attempt that has one, ``reference_pool`` for a
    reference job on reference hardware (only there), nothing otherwise."""
    if job.purpose == JobPurpose.REFERENCE:
        run = ReferenceRun.objects.filter(job_id=job.pk).first()
        if run is None or not job.hardware.reference:
            return {}
        return {"reference_pool": cp.reference_pool(cp.pool(), run.needles)}
    challenge = Challenge.objects.filter(job_id=job.pk, attempt=job.attempts).values_list("items", flat=True).first()
    return {"challenge": challenge} if challenge else {}


def _pct(value: Any) -> str:
    return "–" if not isinstance(value, int | float) else f"{100 * value:.1f} %"


def _accuracy_row(label: str, score: dict[str, Any], size: dict[str, Any] | None) -> dict[str, Any]:
    target, reference = score.get("target") or {}, score.get("reference") or {}
    return {"label": label, "n": target.get("n"), "target": _pct(target.get("accuracy")),
            "reference": _pct(reference.get("accuracy")),
            "wilson": f"[{_pct(target.get('wilson_low'))}, {_pct(target.get('wilson_high'))}]",
            "size": _size_text(size)}


def _size_text(size: dict[str, Any] | None) -> str:
    if not isinstance(size, dict):
        return ""
    if "theta" in size:
        capped = " (capped at the pool)" if size.get("capped") else ""
        return (f"n = {size.get('n')}{capped}: drop θ {size['theta']:g} from p0 {size.get('p0', 0):.3f} at α "
                f"{size['alpha']:g}, β {size['beta']:g} (at least {size.get('minimum', 1)})")
    return str(size.get("rule") or "")


def portal_scores(align: Any, evaluation: Any) -> dict[str, Any] | None:
    """The cell page's "scored by the portal" block from the newest align and eval results' stored scores
    (``StageResult.challenge_scores``): rows ready to show; None when neither has scores."""
    align_scores = getattr(align, "challenge_scores", None) or {}
    eval_scores = getattr(evaluation, "challenge_scores", None) or {}
    if not align_scores and not eval_scores:
        return None
    out: dict[str, Any] = {"e2e": None, "rows": [], "ppl": None, "needle": [],
                           "align_job": getattr(align, "job_id", None) if align_scores else None,
                           "eval_job": getattr(evaluation, "job_id", None) if eval_scores else None}
    e2e = align_scores.get("e2e")
    if isinstance(e2e, dict):
        out["e2e"] = {"n": e2e.get("n"), "rate": _pct(e2e.get("token_match_rate")), "matched": e2e.get("matched"),
                      "compared": e2e.get("compared"), "near_ties": e2e.get("near_ties"),
                      "hard": len(e2e.get("hard") or []), "minimum": _pct(e2e.get("min_token_match_rate")),
                      "top_k": e2e.get("top_k"), "lp_max": e2e.get("logprob_diff_max"),
                      "lp_mean": e2e.get("logprob_diff_mean")}
    sizes = eval_scores.get("sizes") or {}
    for kind, label in (("mc", "multiple choice (accuracy)"), ("qa", "short answers (exact match)")):
        if isinstance(eval_scores.get(kind), dict):
            out["rows"].append(_accuracy_row(label, eval_scores[kind], sizes.get(kind)))
    ppl = eval_scores.get("ppl")
    if isinstance(ppl, dict):
        out["ppl"] = {"n": ppl.get("n"), "target": ppl.get("target"), "reference": ppl.get("reference")}
    for row in eval_scores.get("needle") or []:
        if isinstance(row, dict):
            out["needle"].append({"length": row.get("length"), **_accuracy_row(
                f"needle at {row.get('length')} tokens", {"target": row.get("target"),
                                                         "reference": row.get("reference")}, None)})
    out["rtol"] = eval_scores.get("rtol")
    out["acting"] = acting_scores(eval_scores)
    return out


def acting_scores(eval_scores: dict[str, Any]) -> dict[str, Any] | None:
    """The challenge's code and agent items as the portal scored them (``contract.challenges.acting``): a summary
    row per task and a row per item, the reference's result beside the target's (never its completion or
    actions); None when the eval challenge drew neither."""
    code, agent = eval_scores.get("code"), eval_scores.get("agent")
    if not isinstance(code, dict) and not isinstance(agent, dict):
        return None
    out: dict[str, Any] = {"code": None, "agent": None}
    sizes = eval_scores.get("sizes") or {}
    if isinstance(code, dict):
        rate = code.get("pass_at_1") or {}
        out["code"] = {"n": code.get("n"), "reference": _pct(rate.get("reference")), "target": _pct(rate.get("target")),
                       "agreement": _pct(code.get("agreement")), "same": _pct(code.get("same_completions")),
                       "disputes": len(code.get("disputes") or []), "agents_word": len(code.get("agents_word") or []),
                       "tolerance": code.get("tolerance"), "size": _size_text(sizes.get("code")),
                       "rows": [r for r in code.get("rows") or [] if isinstance(r, dict)]}
    if isinstance(agent, dict):
        rate = agent.get("success") or {}
        out["agent"] = {"n": agent.get("n"), "reference": _pct(rate.get("reference")),
                        "target": _pct(rate.get("target")), "agreement": _pct(agent.get("turn_agreement")),
                        "minimum": agent.get("min_turn_agreement"), "tolerance": agent.get("tolerance"),
                        "false_claims": len(agent.get("false_claims") or []), "size": _size_text(sizes.get("agent")),
                        "rows": [{**r, "agreement": _pct(r.get("turn_agreement"))}
                                 for r in agent.get("rows") or [] if isinstance(r, dict)]}
    return out
