"""The agent's one Celery task: run a job's pipeline and report it to the portal.

Thin by design: the task checks that the delivery is current and hands it to a run (``runs``): ``JobRun`` for
the job (one host, or node 0 of a multi-node job), ``NodeRun`` for another node of a multi-node job."""

from __future__ import annotations

import logging
from typing import Any

from agents.worker.agent_state import STATE
from agents.worker.app import app
from agents.worker.client import PortalClient, PortalError, PortalUnavailable
from agents.worker.runs import JobRun, NodeRun
from contract.queues import RUN_JOB_TASK

logger = logging.getLogger(__name__)

# a delivery waits this many times 5 s for an unreachable portal before the broker drops it (the portal's
# lost-job detection and attempt cap decide what happens to the job then)
MAX_DELIVERY_RETRIES = 60


def _is_current(job: dict[str, Any], spec: dict[str, Any], running_ok: bool = False) -> str | None:
    """Why this delivery must not run (a stale redelivery or a finished job), or None. ``running_ok``: a
    multi-node job's other node, which joins the job node 0 claimed."""
    if job.get("state") not in ("queued", "dispatched", *(("running",) if running_ok else ())):
        return f"job is {job.get('state')}"
    attempt = spec.get("attempt")
    if attempt is not None and job.get("attempts") not in (None, attempt):
        return f"delivery of attempt {attempt} but the job is at attempt {job.get('attempts')}"
    return None


@app.task(name=RUN_JOB_TASK, bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=MAX_DELIVERY_RETRIES)
def run_job_task(self: Any, job_id: int, spec: dict[str, Any]) -> dict[str, Any] | None:
    """Runs job ``job_id`` as its ``spec`` says; returns a short summary (or None when skipped)."""
    if STATE.stopping.is_set():
        from celery.exceptions import Reject

        raise Reject("the agent is stopping", requeue=True)  # leave the delivery to the next agent
    client = PortalClient(STATE.portal_url, STATE.token)
    try:
        job = client.get_job(job_id)
    except PortalUnavailable as exc:
        raise self.retry(exc=exc, countdown=5) from exc
    except PortalError as exc:
        logger.warning("job %s: cannot read it (%s); dropping the delivery", job_id, exc)
        return None
    rank = (spec.get("node") or {}).get("node_rank") if isinstance(spec.get("node"), dict) else None
    node_delivery = isinstance(rank, int) and not isinstance(rank, bool) and rank > 0
    reason = _is_current(job, spec, running_ok=node_delivery)  # node 0 may have claimed the job already
    if reason:
        logger.info("job %s: skipping delivery (%s)", job_id, reason)
        return None
    if node_delivery:
        return NodeRun(self, client, job_id, job, spec, rank).run()
    return JobRun(self, client, job_id, job, spec).run()
