"""The job console: a job's stage timeline and its newest log lines (a fixed number of queries)."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Max, Subquery

from apps.accounts.access import Actor
from apps.dashboards.selectors.fleet import online_agent_count
from apps.dashboards.selectors.jobs import previous_job_ids
from apps.jobs.choices import ACTIVE_STATES, FINISHED_STATES, JobState
from apps.jobs.models import Job, JobEvent, JobNode
from apps.jobs.selectors import visible_jobs
from apps.jobs.services import can_cancel_job

CONSOLE_LINES = 500


@dataclass
class StageStatus:
    stage: str
    status: str  # pending | running | done | failed | skipped
    done: int | None = None
    total: int | None = None
    what: str = ""
    seconds: float | None = None

    @property
    def percent(self) -> int | None:
        return round(100 * self.done / self.total) if self.done is not None and self.total else None


@dataclass
class JobPage:
    job: Job
    stages: list[StageStatus]
    events: list[JobEvent]
    earlier: int
    last_seq: int
    can_cancel: bool
    online_agents: int | None = None  # agents of the job's hardware online, while the job is active
    previous_job: int | None = None  # the job before it in the same cell, to compare with
    nodes: list[JobNode] | None = None  # a multi-node job: its hosts (newest attempt), node rank order

    @property
    def finished(self) -> bool:
        return self.job.state in FINISHED_STATES


def job_page(actor: Actor, job_id: int) -> JobPage | None:
    """The job (None when invisible), its stage timeline and its newest log lines (a fixed number of queries)."""
    job = visible_jobs(actor).filter(pk=job_id).first()
    if job is None:
        return None
    # Up to the highest contiguous seq stored: the WebSocket replays from there, in order, so an event
    # after a gap is shown once, when the gap fills.
    last_seq = job.events_acked
    events = JobEvent.objects.filter(job=job, node=0, seq__lte=last_seq)  # node 0: the job's own sequence
    lines = events.exclude(kind="progress").only("seq", "ts", "stage", "kind", "level", "message")
    shown = list(lines.order_by("-seq")[:CONSOLE_LINES])[::-1]
    for e in shown:  # a table (the benchmark's) keeps its columns: scrolled, not wrapped, on a phone
        e.multiline = "\n" in (e.message or "")
    earlier = lines.filter(seq__lt=shown[0].seq).count() if len(shown) == CONSOLE_LINES else 0
    names = list(job.stages)
    status: dict[str, StageStatus] = {}
    marks = events.filter(kind__in=("stage_started", "stage_finished")).order_by("seq").values_list(
        "stage", "kind", "data__passed", "data__seconds")
    for stage, kind, passed, seconds in marks:
        s = status.setdefault(stage, StageStatus(stage, "running"))
        if kind == "stage_finished":
            s.status = "failed" if passed is False else "done"
            s.seconds = seconds if isinstance(seconds, int | float) else None
        if stage not in names:
            names.append(stage)
    newest_progress = (events.filter(kind="progress").values("stage").annotate(seq=Max("seq")).values("seq"))
    for stage, data in events.filter(kind="progress", seq__in=Subquery(newest_progress)).values_list("stage", "data"):
        s = status.setdefault(stage, StageStatus(stage, "running"))
        if isinstance(data, dict) and isinstance(data.get("total"), int | float) and data["total"] > 0:
            s.done, s.total, s.what = int(data.get("done") or 0), int(data["total"]), str(data.get("what") or "")
        if stage not in names:
            names.append(stage)
    stages = [status.get(n) or StageStatus(n, "pending") for n in names]
    # stages that never started after a failure, or in a job that ended without success, will not run
    ended = job.state in (JobState.FAILED, JobState.CANCELLED, JobState.LOST)
    failed_seen = False
    for s in stages:
        failed_seen = failed_seen or s.status == "failed"
        if s.status == "pending" and (failed_seen or ended):
            s.status = "skipped"
    online = online_agent_count(job.hardware_id) if job.state in ACTIVE_STATES else None
    previous = previous_job_ids([job]).get(job.pk)
    return JobPage(job, stages, shown, earlier, last_seq, can_cancel_job(actor, job), online, previous,
                   job_nodes(job))


def job_nodes(job: Job) -> list[JobNode] | None:
    """A multi-node job's nodes of its newest attempt (node rank, agent, state, where the ranks meet), in rank
    order; None for a one-node job that never reserved nodes (one query)."""
    rows = list(JobNode.objects.filter(job=job).select_related("agent").order_by("-attempt", "rank")
                .only("attempt", "rank", "state", "error", "master_addr", "master_port", "claimed_at",
                      "finished_at", "reserved_at", "agent__hostname", "agent__id"))
    if not rows:
        return [] if job.nodes > 1 else None
    newest = rows[0].attempt
    return [r for r in rows if r.attempt == newest]
