"""What a cell's history keeps and what it cannot hide: the newest failed, lost or cancelled job stays "failed
at" until a newer job proves again what it failed, and every tier change or re-judging is an entry with its
reason (``CellHistory``)."""

from __future__ import annotations

from typing import Any

from django.db.models import Max

from apps.catalog.engines import engine_jobs_q
from apps.catalog.models import Engine
from apps.evidence.selectors import cell_results
from apps.jobs.choices import JobPurpose, JobState
from apps.jobs.models import Job
from apps.matrix.models import Cell, CellHistory
from contract.tiers import DEFAULT_STAGES, STAGE_ORDER
from contract.verdicts import PASS

UNSUCCESSFUL_STATES = (JobState.FAILED, JobState.LOST, JobState.CANCELLED)
FAILURES_SCANNED = 50  # the newest unsuccessful jobs of a cell looked at for one still open
HISTORY_REASON_MAX = 2000


def stages_to_prove(job: Job, passed_in_job: set[tuple[int, str]]) -> list[str]:
    """What a newer job must pass again to clear ``job``'s failure: the stage it failed at; for a job that
    failed outside a stage (lost, cancelled, the agent itself), every stage it asked for and did not pass."""
    if job.failed_stage in STAGE_ORDER:
        return [job.failed_stage]
    requested = job.stages or list(DEFAULT_STAGES)
    return [s for s in STAGE_ORDER if s in requested and (job.pk, s) not in passed_in_job]


def open_failure(model_id: int, hardware_id: int, engine: Engine | None = None) -> Job | None:
    """The newest failed, lost or cancelled job of the cell (of ``engine``'s jobs, when given) that no newer job
    has proved wrong: one of its stages to prove (``stages_to_prove``) has no passing verdict from a job created
    after it. Three queries."""
    jobs = Job.objects.filter(model_id=model_id, hardware_id=hardware_id, state__in=UNSUCCESSFUL_STATES,
                              purpose=JobPurpose.CERTIFY)
    if engine is not None:
        jobs = jobs.filter(engine_jobs_q(engine))
    failures = list(jobs
                    .order_by("-finished_at", "-id")
                    .only("id", "state", "spec", "failed_stage", "error", "created_at")[:FAILURES_SCANNED])
    if not failures:
        return None
    passes = cell_results(model_id, hardware_id).filter(verdict=PASS)
    if engine is not None:
        passes = passes.filter(engine_jobs_q(engine, "job__"))
    newest_pass = dict(passes.values("stage").annotate(latest=Max("job__created_at")).values_list("stage", "latest"))
    passed_in_job = set(passes.filter(job_id__in=[j.pk for j in failures]).values_list("job_id", "stage"))
    for job in failures:
        if any(newest_pass.get(stage) is None or newest_pass[stage] <= job.created_at
               for stage in stages_to_prove(job, passed_in_job)):
            return job
    return None


def failure_label(job: Job) -> str:
    """How the cell names an open failure: its stage, or the job's state (``lost``, ``cancelled``)."""
    return job.failed_stage or str(job.state)


def record_history(cell: Cell, *, kind: str, tier_before: int, reason: str,
                   data: dict[str, Any] | None = None) -> CellHistory:
    return CellHistory.objects.create(cell=cell, kind=kind, tier_before=tier_before, tier_after=cell.tier,
                                      reason=reason[:HISTORY_REASON_MAX], data=data or {})


def cell_history(cell: Cell, *, limit: int = 50) -> list[dict[str, Any]]:
    """The newest entries of a cell's history, newest first, as the API and pages show them."""
    return [{"at": h.at.isoformat(), "kind": h.kind, "tier_before": h.tier_before, "tier_after": h.tier_after,
             "reason": h.reason, "data": h.data}
            for h in CellHistory.objects.filter(cell=cell).order_by("-at", "-id")[:limit]]
