"""The agent's one Celery task: run a job's pipeline and report it to the portal.

Thin by design: the task checks that the delivery is current, builds a ``StageContext`` from the job spec the
payload carries, and calls ``run_pipeline``. Events go through the durable spool and each stage's section through
the durable outbox (both survive an agent restart, under the folder of this portal and agent); a watcher polls
the job's state and sets ``ctx.cancel_event`` when it is cancelled, which the pipeline honours between steps.
When the worker shuts down (``lifecycle``), the pipeline is cancelled too and no loop waits for the portal:
what was not delivered stays on disk, and the portal re-queues the job when it sees the agent gone."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from agents.worker.agent_state import STATE
from agents.worker.app import TASK_NAME, app
from agents.worker.client import PortalClient, PortalError, PortalUnavailable
from agents.worker.outbox import ResultOutbox
from agents.worker.spool import JobSpool, SpoolGap, SpoolSender, release_job_files

logger = logging.getLogger(__name__)

CANCEL_POLL_SECONDS = float(os.environ.get("DAY0_AGENT_CANCEL_POLL", "1.0"))
FLUSH_SECONDS = float(os.environ.get("DAY0_AGENT_FLUSH_SECONDS", "600"))
# a delivery waits this many times 5 s for an unreachable portal before the broker drops it (the portal's
# lost-job detection and attempt cap decide what happens to the job then)
MAX_DELIVERY_RETRIES = 60
RESERVED_BACKOFF_SECONDS = 1.0


def _model_dir(spec: dict[str, Any]) -> Path | None:
    """``--models-dir/<model-slug>``, else a path the job spec names (local demo models), else None."""
    model = spec.get("model") or {}
    candidates = []
    if STATE.models_dir and model.get("slug"):
        candidates.append(Path(STATE.models_dir) / model["slug"])
    if model.get("path"):
        candidates.append(Path(model["path"]))
    for path in candidates:
        if (path / "config.json").is_file():
            return path
    return None


def build_context(job_id: int, spec: dict[str, Any], emit_fn: Any) -> Any:
    """The ``StageContext`` of a job spec (as ``apps.jobs.dispatch`` builds it). The agent is not handed the
    release's manifest: its load reports each shard's digest and the portal compares; the spec's
    ``weight_samples`` (a reference run) or ``weight_probe`` (a certify job) go to the load stage."""
    from agents.pipeline.support.context import StageContext

    model_dir = _model_dir(spec)
    config = (spec.get("model") or {}).get("config")
    if model_dir is not None:
        config = json.loads((model_dir / "config.json").read_text())
    if not isinstance(config, dict):
        raise ValueError(f"job {job_id}: no model files and no config in the job spec")
    hardware = dict(spec.get("hardware") or {})
    hardware.setdefault("memory_gb", (hardware.get("memory_bytes") or 0) / 1e9)
    workdir = STATE.work_dir / f"job-{job_id}"
    workdir.mkdir(parents=True, exist_ok=True)
    for key in ("weight_samples", "weight_probe", "challenge", "reference_pool"):
        if spec.get(key) is not None and not isinstance(spec[key], dict):
            raise ValueError(f"job {job_id}: the delivery's {key} must be an object, got {type(spec[key]).__name__}")
    return StageContext(
        purpose=str(spec.get("purpose") or "certify"), nonce=spec.get("nonce") or None,
        challenge=spec.get("challenge"), reference_pool=spec.get("reference_pool"),
        model_dir=model_dir, config=config, hardware=hardware, dtype=spec.get("dtype") or "float32",
        device=STATE.device, tp=spec.get("tp"), ep=spec.get("ep"), pp=spec.get("pp"),
        thresholds=dict(spec.get("thresholds") or {}),
        bench=dict(spec.get("bench") or {}), workdir=workdir, emit_fn=emit_fn,
        weight_samples=spec.get("weight_samples"), weight_probe=spec.get("weight_probe"),
        node=node_of(job_id, spec),
    )


def node_of(job_id: int, spec: dict[str, Any]) -> Any:
    """The ``NodeSpec`` a multi-node job's delivery names (``spec["node"]``), or None for one host; a
    ValueError names a malformed one."""
    node = spec.get("node")
    if node is None:
        return None
    from agents.runtime.nodes import NodeSpec

    if not isinstance(node, dict):
        raise ValueError(f"job {job_id}: the delivery's node must be an object, got {type(node).__name__}")
    try:
        return NodeSpec(node.get("nnodes"), node.get("node_rank"), node.get("master_addr"),
                        node.get("master_port"), float(spec.get("rendezvous_timeout") or 600))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"job {job_id}: the delivery's node is not valid: {exc}") from None


def _watch_cancel(client: PortalClient, job_id: int, cancel: threading.Event, done: threading.Event) -> None:
    """Stop the pipeline between steps once the job is cancelled, or failed by the portal (another node of a
    multi-node job could not run its ranks: this node's would wait for it)."""
    while not done.wait(CANCEL_POLL_SECONDS):
        try:
            if client.get_job(job_id).get("state") in ("cancelled", "failed"):
                cancel.set()
                return
        except PortalError:
            continue  # the portal is away: keep running, check again later


def _is_current(job: dict[str, Any], spec: dict[str, Any], running_ok: bool = False) -> str | None:
    """Why this delivery must not run (a stale redelivery or a finished job), or None. ``running_ok``: a
    multi-node job's other node, which joins the job node 0 claimed."""
    if job.get("state") not in ("queued", "dispatched", *(("running",) if running_ok else ())):
        return f"job is {job.get('state')}"
    attempt = spec.get("attempt")
    if attempt is not None and job.get("attempts") not in (None, attempt):
        return f"delivery of attempt {attempt} but the job is at attempt {job.get('attempts')}"
    return None


def _retryable(exc: Exception) -> bool:
    """Worth posting again later: the portal is away (5xx, 429, no answer); not a 4xx refusal."""
    return isinstance(exc, PortalUnavailable) or not isinstance(exc, PortalError | SpoolGap)


@app.task(name=TASK_NAME, bind=True, acks_late=True, reject_on_worker_lost=True, max_retries=MAX_DELIVERY_RETRIES)
def run_job_task(self: Any, job_id: int, spec: dict[str, Any]) -> dict[str, Any] | None:
    """Runs job ``job_id`` as its ``spec`` says; returns a short summary (or None when skipped)."""
    from agents.pipeline.runner import run_pipeline
    from agents.pipeline.tiers import DEFAULT_STAGES

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
        return run_node(self, client, job_id, job, spec, rank)

    STATE.current_job = job_id  # before the claim, so no heartbeat after it reports another job
    try:
        claimed = client.set_job_state(job_id, "running", agent_id=STATE.agent_id, attempt=spec.get("attempt"))
    except PortalUnavailable as exc:
        STATE.current_job = None
        raise self.retry(exc=exc, countdown=5) from exc
    except PortalError as exc:  # cancelled, re-queued or claimed by another agent in between: not ours to run
        STATE.current_job = None
        if exc.status == 409 and "is reserved for node" in str(exc):  # this agent runs a multi-node job next
            from celery.exceptions import Reject

            logger.info("job %s: %s; handing the delivery back", job_id, exc)
            time.sleep(RESERVED_BACKOFF_SECONDS)  # not a hot loop while the reserved node's task is on its way
            raise Reject(str(exc), requeue=True) from exc
        logger.warning("job %s: the portal refused the claim (%s); dropping the delivery", job_id, exc)
        return None
    if STATE.agent_id is not None:
        try:  # tell the portal at once which job this agent runs
            client.heartbeat(STATE.agent_id, current_job=job_id)
        except PortalError as exc:
            logger.warning("job %s: heartbeat failed (%s); the heartbeat thread will report it", job_id, exc)

    folder = STATE.spool_dir
    identity = f"{STATE.portal_url.rstrip('/')} job {job_id} created {job.get('created_at')}"
    acked = (claimed or {}).get("events_acked", job.get("events_acked"))
    spool = JobSpool(folder, job_id, portal_acked=int(acked or 0), identity=identity)
    binding = {"attempt": spec.get("attempt"), "nonce": spec.get("nonce")}
    outbox = ResultOutbox(folder, job_id,
                          lambda stage, section, bound: client.post_result(job_id, stage, section, bound),
                          retry_on=PortalUnavailable, identity=identity, binding=binding)
    sender_client = PortalClient(STATE.portal_url, STATE.token)

    def post(jid: int, events: list[dict[str, Any]]) -> int:
        acked = sender_client.post_events(jid, events)
        outbox.drain()  # results follow the events that announce them
        return acked

    sender = SpoolSender(spool, post, retryable=_retryable).start()

    def emit(kind: str, message: str, *, level: str = "info", data: dict | None = None, stage: str = "") -> None:
        if kind == "result" and data and "section" in data:
            outbox.add(data.get("stage") or stage, data["section"])
            data = {"stage": data.get("stage") or stage}  # the section travels once, as a result
        spool.append(stage=stage, kind=kind, message=message, level=level, data=data)
        if kind != "progress":
            sender.wake()

    done = threading.Event()
    try:
        ctx = build_context(job_id, spec, emit)
        STATE.cancel_event = ctx.cancel_event
        if STATE.stopping.is_set():
            ctx.cancel_event.set()
        watcher = threading.Thread(target=_watch_cancel, args=(client, job_id, ctx.cancel_event, done), daemon=True)
        watcher.start()
        emit("log", f"agent {STATE.hostname} runs job {job_id} (attempt {spec.get('attempt')}) on {ctx.device}")
        report = run_pipeline(ctx, spec.get("stages") or list(DEFAULT_STAGES))
    except Exception as exc:  # noqa: BLE001 — any failure before or around the pipeline fails the job, named
        logger.exception("job %s failed outside the pipeline", job_id)
        emit("log", f"{type(exc).__name__}: {exc}", level="error")
        report = {"failed_stage": "agent", "error": f"{type(exc).__name__}: {exc}", "tier": 0, "stages": {}}
    finally:
        done.set()
        STATE.cancel_event = None
    cancelled = report.get("error") == "cancelled"
    _finish(client, sender, outbox, job_id, report, cancelled)
    spool.close()
    outbox.close()
    release_job_files(folder, job_id)
    sender_client.close()
    client.close()
    STATE.current_job = None
    return {"job": job_id, "tier": report.get("tier"), "failed_stage": report.get("failed_stage")}


def _finish(client: PortalClient, sender: SpoolSender, outbox: ResultOutbox, job_id: int, report: dict[str, Any],
            cancelled: bool) -> None:
    """Delivers every event and result, then the final state (a cancelled job is already final). A spool the
    portal cannot accept fails the job naming why; a shutdown leaves what is undelivered on disk."""
    flushed = sender.flush(FLUSH_SECONDS, abort=STATE.stopping)
    sender.stop()
    if STATE.stopping.is_set():
        logger.warning("job %s: the agent is stopping; undelivered events and results stay in %s", job_id,
                       STATE.spool_dir)
        return
    if sender.fatal and not cancelled:
        report = {**report, "failed_stage": report.get("failed_stage") or "agent",
                  "error": f"the job's event log cannot be delivered: {sender.fatal}"}
    deadline = time.monotonic() + FLUSH_SECONDS
    while True:
        try:
            outbox.drain()
            if cancelled:
                return
            failed = report.get("failed_stage")
            if failed:
                client.set_job_state(job_id, "failed", failed_stage=failed, error=report.get("error") or "failed",
                                     agent_id=STATE.agent_id)
            else:
                client.set_job_state(job_id, "succeeded", agent_id=STATE.agent_id)
            return
        except PortalUnavailable:
            if time.monotonic() > deadline:
                logger.error("job %s: portal unreachable; the final state was not delivered", job_id)
                return
            if STATE.stopping.wait(2):
                return
        except PortalError as exc:
            logger.warning("job %s: final report refused: %s (events flushed: %s)", job_id, exc, flushed)
            return


def run_node(task: Any, client: PortalClient, job_id: int, job: dict[str, Any], spec: dict[str, Any],
             rank: int) -> dict[str, Any] | None:
    """A multi-node job's node ``rank`` > 0 on this agent: claim the node, run its ranks of the job's ranked
    stages (``agents.pipeline.follower.follow``), post its stage events to the node's log and say how it ended.
    Node 0 claims the job, posts the results and finishes it."""
    from agents.pipeline.follower import follow
    from agents.pipeline.tiers import DEFAULT_STAGES

    attempt = spec.get("attempt")
    STATE.current_job = job_id
    try:
        claimed = client.set_node_state(job_id, rank, "running", attempt=attempt)
    except PortalUnavailable as exc:
        STATE.current_job = None
        raise task.retry(exc=exc, countdown=5) from exc
    except PortalError as exc:  # released (a sibling could not start), cancelled or a stale attempt
        STATE.current_job = None
        logger.warning("job %s node %s: the portal refused the claim (%s); dropping the delivery", job_id, rank, exc)
        return None
    folder = STATE.spool_dir / f"node{rank}"
    identity = f"{STATE.portal_url.rstrip('/')} job {job_id} created {job.get('created_at')} node {rank}"
    spool = JobSpool(folder, job_id, portal_acked=int(claimed.get("events_acked") or 0), identity=identity)
    sender_client = PortalClient(STATE.portal_url, STATE.token)
    sender = SpoolSender(spool, lambda jid, events: sender_client.post_node_events(jid, rank, events),
                         retryable=_retryable).start()

    def emit(kind: str, message: str, *, level: str = "info", data: dict | None = None, stage: str = "") -> None:
        if kind in ("result", "progress"):
            return  # node 0 posts the results; a follower's progress is its ranks', seen on node 0
        spool.append(stage=stage, kind=kind, message=message, level=level, data=data)
        sender.wake()

    done = threading.Event()
    try:
        ctx = build_context(job_id, spec, emit)
        STATE.cancel_event = ctx.cancel_event
        watcher = threading.Thread(target=_watch_cancel, args=(client, job_id, ctx.cancel_event, done), daemon=True)
        watcher.start()
        emit("log", f"agent {STATE.hostname} runs node {rank} of {ctx.node.nnodes} of job {job_id} "
                    f"(attempt {attempt}), ranks meet at {ctx.node.master_addr}:{ctx.node.master_port}")
        outcome = follow(ctx, spec.get("stages") or list(DEFAULT_STAGES))
    except Exception as exc:  # noqa: BLE001 - the node failed outside its ranks: say so on its row
        logger.exception("job %s node %s failed", job_id, rank)
        outcome = {"failed_stage": "agent", "error": f"{type(exc).__name__}: {exc}"}
    finally:
        done.set()
        STATE.cancel_event = None
    sender.flush(FLUSH_SECONDS, abort=STATE.stopping)
    sender.stop()
    error = outcome.get("error")
    try:
        client.set_node_state(job_id, rank, "failed" if outcome.get("failed_stage") else "finished",
                              error=f"{outcome.get('failed_stage')}: {error}" if error else None)
    except PortalError as exc:
        logger.warning("job %s node %s: final state refused: %s", job_id, rank, exc)
    spool.close()
    release_job_files(folder, job_id)
    sender_client.close()
    client.close()
    STATE.current_job = None
    return {"job": job_id, "node": rank, "failed_stage": outcome.get("failed_stage")}
