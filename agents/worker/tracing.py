"""The agent's part of a job's trace: a span around each ``day0.run_job`` task, continuing the trace the portal
sent in the message headers (``traceparent``, the job id in ``baggage``), its log lines marked with the job. The
pipeline's stage spans and the runtime's request spans nest under it. Connected by Celery's signals, so the task
body knows nothing of it."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from celery import signals
from opentelemetry.trace import SpanKind

from contract.queues import RUN_JOB_TASK
from telemetry import tracing

_open: dict[str, ExitStack] = {}  # task id -> the span and job context of the task running


@signals.after_setup_logger.connect(dispatch_uid="day0.tracing.logger")
@signals.after_setup_task_logger.connect(dispatch_uid="day0.tracing.task_logger")
def _mark_log_lines(logger: Any = None, **kwargs: Any) -> None:
    if logger is not None:
        tracing.install_log_context(logger.handlers)


@signals.task_prerun.connect(dispatch_uid="day0.tracing.prerun")
def _task_started(task_id: str | None = None, task: Any = None, args: Any = None, **kwargs: Any) -> None:
    if task is None or task.name != RUN_JOB_TASK or not task_id:
        return
    tracing.configure("day0-agent")
    tracing.install_log_context()  # the root logger's handlers (the agent's, when Celery leaves them alone)
    job_id = args[0] if args else None
    stack = ExitStack()
    stack.enter_context(tracing.span("agent.run_job", job_id=job_id, kind=SpanKind.CONSUMER,
                                     parent=tracing.extract(task.request), **{"celery.task_id": task_id}))
    _open[task_id] = stack


@signals.task_postrun.connect(dispatch_uid="day0.tracing.postrun")
def _task_finished(task_id: str | None = None, **kwargs: Any) -> None:
    stack = _open.pop(task_id, None) if task_id else None
    if stack is not None:
        stack.close()
