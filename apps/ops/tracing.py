"""The portal's part of a job's trace (``telemetry.tracing``): a span per API request (the submit among them,
with the new job's id), and the dispatch span whose context travels in the Celery message's headers to the
agent. Log lines written while a request for a job is served carry the job id (``LOGGING``'s formatter)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from celery import signals
from django.http import HttpRequest, HttpResponse
from opentelemetry.trace import SpanKind

from contract.queues import RUN_JOB_TASK
from telemetry import tracing

JOB_PATH = re.compile(r"^/api/v1/jobs/(\d+)(/|$)")


class TraceMiddleware:
    """A server span per ``/api/`` request, continuing the caller's trace when it sent one."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if not request.path.startswith("/api/"):
            return self.get_response(request)
        match = JOB_PATH.match(request.path)
        parent = tracing.extract({k: request.headers.get(k) for k in ("traceparent", "tracestate", "baggage")})
        with tracing.span(f"{request.method} {request.path}", job_id=match.group(1) if match else None,
                          kind=SpanKind.SERVER, parent=parent, **{"http.request.method": request.method,
                                                                  "url.path": request.path}) as current:
            response = self.get_response(request)
            current.set_attribute("http.response.status_code", response.status_code)
            created = getattr(response, "data", None)
            if request.path == "/api/v1/jobs/" and response.status_code == 201 and isinstance(created, dict):
                current.set_attribute(tracing.JOB_ATTRIBUTE, str(created.get("id")))
            return response


@signals.before_task_publish.connect(dispatch_uid="ops.trace_dispatch")
def trace_dispatch(sender: str | None = None, body: Any = None, headers: dict | None = None, **kwargs: Any) -> None:
    """The agent task's message carries the dispatch span's context (``traceparent``, the job in ``baggage``)."""
    if sender != RUN_JOB_TASK or headers is None:
        return
    args = body[0] if isinstance(body, tuple | list) and body and isinstance(body[0], list | tuple) else []
    job_id = args[0] if args else None
    with tracing.span("portal.dispatch", job_id=job_id, kind=SpanKind.PRODUCER,
                      **{"messaging.destination.name": kwargs.get("routing_key")}):
        tracing.inject(headers)
