"""The facts of a job the bench and align verdicts check against beyond its release and hardware (kept apart
from ``services`` so that each stays short)."""

from __future__ import annotations

from typing import Any

from apps.evidence.models import StageResult
from apps.jobs.models import Job


def physics_facts(job: Job, sections: dict[str, Any]) -> dict[str, Any]:
    """What the bench and align rules check against: the layout the job ran (its pinned degrees, else its plan
    evidence), what it asked the bench to run (``spec.bench``) and the operators of its inventory section."""
    def section(stage: str) -> dict[str, Any]:
        own = sections.get(stage)
        if isinstance(own, dict):
            return own
        stored = StageResult.objects.filter(job=job, stage=stage).values_list("section", flat=True).first()
        return stored if isinstance(stored, dict) else {}

    plan = section("plan").get("plan")
    plan = plan if isinstance(plan, dict) else {}
    layout = {k: job.spec.get(k) or plan.get(k) for k in ("tp", "pp", "ep")}
    inventory = section("inventory").get("ops")
    ops = [str(r["op"]) for r in inventory if isinstance(r, dict) and r.get("op")] if isinstance(inventory, list) \
        else None
    bench = job.spec.get("bench")
    return {"layout": layout, "bench_asked": bench if isinstance(bench, dict) else None, "inventory_ops": ops}
