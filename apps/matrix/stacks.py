"""What a stack change of a hardware pool means for the matrix: the re-validation jobs its pool's policy asks for
(queued while the change is recorded: the ``stack_change_recorded`` event of ``fleet.stacks``), and which cells'
evidence is *stale since <change>*: while a stage it proved (its newest passing verdict) predates a change of its
hardware; only a passing verdict of every such stage after the change clears it."""

from __future__ import annotations

import copy
from typing import Any

from django.db.models import Max

from apps.catalog.engines import engine_jobs_q
from apps.catalog.models import Hardware
from apps.evidence.models import EnvLock, StageResult
from apps.fleet.choices import RevalidationPolicy
from apps.fleet.models import HardwarePolicy, StackChange
from apps.fleet.stacks import MAX_REVALIDATION_JOBS, stack_of
from apps.jobs.choices import ACTIVE_STATES
from apps.jobs.models import Job
from apps.jobs.services import do_create_job
from apps.matrix.models import Cell
from contract.engines import DEFAULT_ENGINE
from contract.verdicts import PASS


def on_stack_change_recorded(*, change: StackChange, policy: HardwarePolicy | None, **_: Any) -> None:
    """Queues the change's re-validation jobs and keeps their ids on it."""
    change.jobs = queue_revalidation(change.hardware, policy, change)
    change.save(update_fields=["jobs"])


def queue_revalidation(hardware: Hardware, policy: HardwarePolicy | None, change: StackChange) -> list[int]:
    """One job per affected cell, with the stages and settings of the cell's newest agent job (seeded,
    synthetic jobs are not re-run); cells with a job still active are skipped (it runs on the new stack)."""
    if policy is None or policy.policy == RevalidationPolicy.OFF:
        return []
    min_tier = policy.min_tier if policy.policy == RevalidationPolicy.AT_OR_ABOVE_TIER else 1
    cells = (Cell.objects.filter(hardware=hardware, tier__gte=min_tier).select_related("model", "engine")
             .order_by("id"))
    # a cell is its engine's: busy while a job of that engine runs, re-validated with that engine's newest job
    busy = {(model_id, name or DEFAULT_ENGINE, version or "") for model_id, name, version in Job.objects.filter(
        hardware=hardware, state__in=ACTIVE_STATES).values_list("model_id", "spec__engine__name",
                                                                 "spec__engine__version")}
    queued: list[int] = []
    for cell in cells[:MAX_REVALIDATION_JOBS]:
        if (cell.model_id, cell.engine.name, cell.engine.version) in busy:
            continue
        recent = Job.objects.filter(engine_jobs_q(cell.engine), model_id=cell.model_id,
                                    hardware=hardware).order_by("-created_at", "-id")[:50]
        last = next((j for j in recent if not (j.spec or {}).get("seeded")), None)  # NULL-safe, unlike exclude()
        if last is None or not last.stages:
            continue
        spec = copy.deepcopy(last.spec)
        spec["revalidation"] = {"stack_change": change.pk, "changed": change.changed, "of_job": last.pk}
        job = do_create_job(model=cell.model, hardware=hardware, spec=spec, organization_id=last.organization_id,
                            requested_by_id=None)
        queued.append(job.pk)
    return queued


def cell_stack(model_id: int, hardware_id: int) -> dict[str, Any]:
    """Which stack a cell's evidence came from (its newest env evidence) and whether it is stale: the stages
    whose newest passing verdict predates a stack change of the hardware (``stale_stages``), ``stale_since``
    the first such change. A stage is proved again only by a passing verdict after the change, so a newer
    result of another stage (or a failing one) clears nothing. Three queries."""
    proved = dict(StageResult.objects.filter(job__model_id=model_id, job__hardware_id=hardware_id, verdict=PASS)
                  .values("stage").annotate(latest=Max("created_at")).values_list("stage", "latest"))
    env = (EnvLock.objects.filter(result__job__model_id=model_id, result__job__hardware_id=hardware_id)
           .order_by("-result__created_at", "-id")
           .values("runtime_commit", "torch", "driver", "device", "result__job_id", "result__created_at").first())
    change, stale_stages = None, []
    if proved:
        changes = list(StackChange.objects.filter(hardware_id=hardware_id, created_at__gt=min(proved.values()))
                       .order_by("created_at", "id")[:MAX_REVALIDATION_JOBS])
        for stage, at in sorted(proved.items()):
            first = next((c for c in changes if c.created_at > at), None)
            if first is not None:
                stale_stages.append(stage)
                if change is None or (first.created_at, first.pk) < (change.created_at, change.pk):
                    change = first
    return {
        "evidence_stack": stack_of(env) if env else None,
        "evidence_job": env["result__job_id"] if env else None,
        "evidence_at": env["result__created_at"].isoformat() if env else None,
        "stale": change is not None,
        "stale_since": change.created_at.isoformat() if change else None,
        "stale_stages": stale_stages,
        "stack_change": ({"id": change.pk, "changed": change.changed, "before": change.before,
                          "after": change.after, "jobs": change.jobs} if change else None),
    }
