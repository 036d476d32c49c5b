"""The runs of the agent's task, on one plumbing (``DeliveryRun``): ``JobRun`` runs a job's pipeline (one host, or
node 0 of a multi-node job), ``NodeRun`` another node's ranks. Events go through the durable spool and each
stage's section through the durable outbox (both survive an agent restart, under the folder of this portal and
agent); a watcher polls the job's state and sets ``ctx.cancel_event`` when it is cancelled, which the pipeline
honours between steps. When the worker shuts down (``lifecycle``), the pipeline is cancelled too and no loop
waits for the portal: what was not delivered stays on disk, and the portal re-queues the job when it sees the
agent gone."""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from agents.worker.agent_state import STATE
from agents.worker.client import PortalClient, PortalError, PortalUnavailable
from agents.worker.job_context import build_context
from agents.worker.outbox import ResultOutbox
from agents.worker.spool import JobSpool, SpoolGap, SpoolSender, release_job_files

logger = logging.getLogger(__name__)

CANCEL_POLL_SECONDS = float(os.environ.get("DAY0_AGENT_CANCEL_POLL", "1.0"))
FLUSH_SECONDS = float(os.environ.get("DAY0_AGENT_FLUSH_SECONDS", "600"))
RESERVED_BACKOFF_SECONDS = 1.0


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


def _retryable(exc: Exception) -> bool:
    """Worth posting again later: the portal is away (5xx, 429, no answer); not a 4xx refusal."""
    return isinstance(exc, PortalUnavailable) or not isinstance(exc, PortalError | SpoolGap)


class DeliveryRun:
    """The plumbing of one delivery, node 0's and a follower node's alike: claim it, spool its events durably
    and send them, build the job's context and watch for a cancel, run the body (a failure outside it is named,
    not raised), report how it ended, clean up. Subclasses say what differs."""

    name: str  # "job 7", "job 7 node 1": how the logs call this delivery
    folder: Path  # where its spool lives
    identity: str  # which job of which portal the spool's files belong to

    def __init__(self, task: Any, client: PortalClient, job_id: int, job: dict[str, Any], spec: dict[str, Any]):
        self.task, self.client, self.job_id, self.job, self.spec = task, client, job_id, job, spec
        self.attempt = spec.get("attempt")
        self.identity = f"{STATE.portal_url.rstrip('/')} job {job_id} created {job.get('created_at')}"

    def claim(self) -> dict[str, Any]:
        """Tells the portal this agent runs the delivery (PortalError when it refuses); returns its answer."""
        raise NotImplementedError

    def refused(self, exc: PortalError) -> None:
        logger.warning("%s: the portal refused the claim (%s); dropping the delivery", self.name, exc)

    def acked(self, claimed: dict[str, Any]) -> int:
        """The highest seq of this delivery's log the portal holds."""
        return int(claimed.get("events_acked") or 0)

    def prepare(self) -> None:
        """What the run needs beside the spool, made before its sender starts."""

    def post_events(self, job_id: int, events: list[dict[str, Any]]) -> int:
        raise NotImplementedError

    def emit(self, kind: str, message: str, *, level: str = "info", data: dict | None = None, stage: str = "") -> None:
        raise NotImplementedError

    def started(self, ctx: Any) -> str:
        """The log line that opens the run."""
        raise NotImplementedError

    def body(self, ctx: Any) -> dict[str, Any]:
        """Runs the stages; returns the outcome (``failed_stage`` and ``error`` at least)."""
        raise NotImplementedError

    def failed_outside(self, exc: Exception) -> dict[str, Any]:
        """The outcome of a failure before or around the body."""
        raise NotImplementedError

    def finish(self, outcome: dict[str, Any]) -> None:
        """Delivers what is left and tells the portal how the run ended."""
        raise NotImplementedError

    def close(self) -> None:
        self.spool.close()

    def summary(self, outcome: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def run(self) -> dict[str, Any] | None:
        """Claims the delivery and runs it; None when the portal refused the claim."""
        STATE.current_job = self.job_id  # before the claim, so no heartbeat after it reports another job
        try:
            claimed = self.claim()
        except PortalUnavailable as exc:
            STATE.current_job = None
            raise self.task.retry(exc=exc, countdown=5) from exc
        except PortalError as exc:  # cancelled, re-queued or claimed by another agent in between: not ours to run
            STATE.current_job = None
            self.refused(exc)
            return None
        self.spool = JobSpool(self.folder, self.job_id, portal_acked=self.acked(claimed), identity=self.identity)
        self.prepare()
        self.sender_client = PortalClient(STATE.portal_url, STATE.token)
        self.sender = SpoolSender(self.spool, self.post_events, retryable=_retryable).start()
        done = threading.Event()
        try:
            ctx = build_context(self.job_id, self.spec, self.emit)
            STATE.cancel_event = ctx.cancel_event
            if STATE.stopping.is_set():
                ctx.cancel_event.set()
            watcher = threading.Thread(target=_watch_cancel, args=(self.client, self.job_id, ctx.cancel_event, done),
                                       daemon=True)
            watcher.start()
            self.emit("log", self.started(ctx))
            outcome = self.body(ctx)
        except Exception as exc:  # noqa: BLE001 — any failure before or around the body ends the run, named
            outcome = self.failed_outside(exc)
        finally:
            done.set()
            STATE.cancel_event = None
        self.finish(outcome)
        self.close()
        release_job_files(self.folder, self.job_id)
        self.sender_client.close()
        self.client.close()
        STATE.current_job = None
        return self.summary(outcome)


class JobRun(DeliveryRun):
    """The job itself (node 0 of a multi-node job): claims the job, runs the pipeline, posts each stage's section
    through the durable outbox after the events that announce it, and sets the job's final state."""

    def __init__(self, task: Any, client: PortalClient, job_id: int, job: dict[str, Any], spec: dict[str, Any]):
        super().__init__(task, client, job_id, job, spec)
        self.name = f"job {job_id}"
        self.folder = STATE.spool_dir

    def claim(self) -> dict[str, Any]:
        claimed = self.client.set_job_state(self.job_id, "running", agent_id=STATE.agent_id, attempt=self.attempt)
        if STATE.agent_id is not None:
            try:  # tell the portal at once which job this agent runs
                self.client.heartbeat(STATE.agent_id, current_job=self.job_id)
            except PortalError as exc:
                logger.warning("job %s: heartbeat failed (%s); the heartbeat thread will report it", self.job_id, exc)
        return claimed or {}

    def refused(self, exc: PortalError) -> None:
        if exc.status == 409 and "is reserved for node" in str(exc):  # this agent runs a multi-node job next
            from celery.exceptions import Reject

            logger.info("job %s: %s; handing the delivery back", self.job_id, exc)
            time.sleep(RESERVED_BACKOFF_SECONDS)  # not a hot loop while the reserved node's task is on its way
            raise Reject(str(exc), requeue=True) from exc
        super().refused(exc)

    def acked(self, claimed: dict[str, Any]) -> int:
        return int(claimed.get("events_acked", self.job.get("events_acked")) or 0)

    def prepare(self) -> None:
        binding = {"attempt": self.attempt, "nonce": self.spec.get("nonce")}
        self.outbox = ResultOutbox(
            self.folder, self.job_id,
            lambda stage, section, bound: self.client.post_result(self.job_id, stage, section, bound),
            retry_on=PortalUnavailable, identity=self.identity, binding=binding)

    def post_events(self, job_id: int, events: list[dict[str, Any]]) -> int:
        acked = self.sender_client.post_events(job_id, events)
        self.outbox.drain()  # results follow the events that announce them
        return acked

    def emit(self, kind: str, message: str, *, level: str = "info", data: dict | None = None, stage: str = "") -> None:
        if kind == "result" and data and "section" in data:
            self.outbox.add(data.get("stage") or stage, data["section"])
            data = {"stage": data.get("stage") or stage}  # the section travels once, as a result
        self.spool.append(stage=stage, kind=kind, message=message, level=level, data=data)
        if kind != "progress":
            self.sender.wake()

    def started(self, ctx: Any) -> str:
        return f"agent {STATE.hostname} runs job {self.job_id} (attempt {self.attempt}) on {ctx.device}"

    def body(self, ctx: Any) -> dict[str, Any]:
        from agents.pipeline.runner import run_pipeline
        from contract.tiers import DEFAULT_STAGES

        return run_pipeline(ctx, self.spec.get("stages") or list(DEFAULT_STAGES))

    def failed_outside(self, exc: Exception) -> dict[str, Any]:
        logger.exception("job %s failed outside the pipeline", self.job_id)
        self.emit("log", f"{type(exc).__name__}: {exc}", level="error")
        return {"failed_stage": "agent", "error": f"{type(exc).__name__}: {exc}", "tier": 0, "stages": {}}

    def finish(self, outcome: dict[str, Any]) -> None:
        """Delivers every event and result, then the final state (a cancelled job is already final). A spool the
        portal cannot accept fails the job naming why; a shutdown leaves what is undelivered on disk."""
        report, cancelled = outcome, outcome.get("error") == "cancelled"
        flushed = self.sender.flush(FLUSH_SECONDS, abort=STATE.stopping)
        self.sender.stop()
        if STATE.stopping.is_set():
            logger.warning("job %s: the agent is stopping; undelivered events and results stay in %s", self.job_id,
                           STATE.spool_dir)
            return
        if self.sender.fatal and not cancelled:
            report = {**report, "failed_stage": report.get("failed_stage") or "agent",
                      "error": f"the job's event log cannot be delivered: {self.sender.fatal}"}
        deadline = time.monotonic() + FLUSH_SECONDS
        while True:
            try:
                self.outbox.drain()
                if cancelled:
                    return
                failed = report.get("failed_stage")
                if failed:
                    self.client.set_job_state(self.job_id, "failed", failed_stage=failed,
                                              error=report.get("error") or "failed", agent_id=STATE.agent_id)
                else:
                    self.client.set_job_state(self.job_id, "succeeded", agent_id=STATE.agent_id)
                return
            except PortalUnavailable:
                if time.monotonic() > deadline:
                    logger.error("job %s: portal unreachable; the final state was not delivered", self.job_id)
                    return
                if STATE.stopping.wait(2):
                    return
            except PortalError as exc:
                logger.warning("job %s: final report refused: %s (events flushed: %s)", self.job_id, exc, flushed)
                return

    def close(self) -> None:
        super().close()
        self.outbox.close()

    def summary(self, outcome: dict[str, Any]) -> dict[str, Any]:
        return {"job": self.job_id, "tier": outcome.get("tier"), "failed_stage": outcome.get("failed_stage")}


class NodeRun(DeliveryRun):
    """A multi-node job's node ``rank`` > 0 on this agent: claims the node, runs its ranks of the job's ranked
    stages (``agents.pipeline.follower.follow``), posts its stage events to the node's log and says how it ended.
    Node 0 claims the job, posts the results and finishes it."""

    def __init__(self, task: Any, client: PortalClient, job_id: int, job: dict[str, Any], spec: dict[str, Any],
                 rank: int):
        super().__init__(task, client, job_id, job, spec)
        self.rank = rank
        self.name = f"job {job_id} node {rank}"
        self.folder = STATE.spool_dir / f"node{rank}"
        self.identity = f"{self.identity} node {rank}"

    def claim(self) -> dict[str, Any]:  # refused: released (a sibling could not start), cancelled or a stale attempt
        return self.client.set_node_state(self.job_id, self.rank, "running", attempt=self.attempt)

    def post_events(self, job_id: int, events: list[dict[str, Any]]) -> int:
        return self.sender_client.post_node_events(job_id, self.rank, events)

    def emit(self, kind: str, message: str, *, level: str = "info", data: dict | None = None, stage: str = "") -> None:
        if kind in ("result", "progress"):
            return  # node 0 posts the results; a follower's progress is its ranks', seen on node 0
        self.spool.append(stage=stage, kind=kind, message=message, level=level, data=data)
        self.sender.wake()

    def started(self, ctx: Any) -> str:
        return (f"agent {STATE.hostname} runs node {self.rank} of {ctx.node.nnodes} of job {self.job_id} "
                f"(attempt {self.attempt}), ranks meet at {ctx.node.master_addr}:{ctx.node.master_port}")

    def body(self, ctx: Any) -> dict[str, Any]:
        from agents.pipeline.follower import follow
        from contract.tiers import DEFAULT_STAGES

        return follow(ctx, self.spec.get("stages") or list(DEFAULT_STAGES))

    def failed_outside(self, exc: Exception) -> dict[str, Any]:  # the node failed outside its ranks: say so on its row
        logger.exception("job %s node %s failed", self.job_id, self.rank)
        return {"failed_stage": "agent", "error": f"{type(exc).__name__}: {exc}"}

    def finish(self, outcome: dict[str, Any]) -> None:
        self.sender.flush(FLUSH_SECONDS, abort=STATE.stopping)
        self.sender.stop()
        error = outcome.get("error")
        try:
            self.client.set_node_state(self.job_id, self.rank, "failed" if outcome.get("failed_stage") else "finished",
                                       error=f"{outcome.get('failed_stage')}: {error}" if error else None)
        except PortalError as exc:
            logger.warning("job %s node %s: final state refused: %s", self.job_id, self.rank, exc)

    def summary(self, outcome: dict[str, Any]) -> dict[str, Any]:
        return {"job": self.job_id, "node": self.rank, "failed_stage": outcome.get("failed_stage")}
