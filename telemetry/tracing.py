"""One trace per job across the portal, the agent and the runtime (OpenTelemetry), and the job id, trace id and
request id in every log line. Plain Python: the portal, the agent and the runtime all import it (it sits in the
lowest layer so the runtime need not look up).

Off by default: unless ``DAY0_TRACING_EXPORTER`` names an exporter, no SDK is installed and OpenTelemetry's API
answers with its no-op tracer (spans cost a function call; context still propagates, so a process with tracing on
continues a trace begun elsewhere). Exporters: ``console`` (spans as JSON on stderr), ``otlp`` (the ``otlp``
extra, ``opentelemetry-exporter-otlp-proto-http``; ``OTEL_EXPORTER_OTLP_*`` say where), ``jsonl:DIR`` (one
file of JSON lines per process under DIR: a trace read without a collector).

Across processes the context travels as W3C ``traceparent`` (and ``baggage`` carrying ``day0.job_id``): in the
portal's Celery message headers, and on the agent's HTTP requests to the runtime."""

from __future__ import annotations

import contextvars
import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry import baggage, context, propagate, trace

ENV = "DAY0_TRACING_EXPORTER"
JOB_ATTRIBUTE = "day0.job_id"
_job_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("day0_job_id", default=None)
_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("day0_request_id", default=None)
_configured: dict[str, Any] = {}
_lock = threading.Lock()


def configure(service: str, exporter: Any = None) -> bool:
    """Installs the SDK once per process when ``exporter`` (a SpanExporter) is given or ``DAY0_TRACING_EXPORTER``
    names one; True when tracing records. A second call changes nothing (the first service name stays)."""
    with _lock:
        if "provider" in _configured:
            return True
        if exporter is None:
            exporter = _exporter_from_env()
            if exporter is None:
                return False
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        provider = TracerProvider(resource=Resource.create({"service.name": service}))
        provider.add_span_processor(_job_id_processor())
        simple = isinstance(exporter, _JsonLinesExporter) or type(exporter).__name__ == "InMemorySpanExporter"
        provider.add_span_processor(SimpleSpanProcessor(exporter) if simple else BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        _configured["provider"] = provider
        return True


def add_exporter(exporter: Any) -> None:
    """Sends every span from now on to ``exporter`` too (installing the SDK without one first if tracing was
    off): an in-memory exporter in a test, shut down when done."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    with _lock:
        if "provider" not in _configured:
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider

            provider = TracerProvider(resource=Resource.create({"service.name": "day0"}))
            provider.add_span_processor(_job_id_processor())
            trace.set_tracer_provider(provider)
            _configured["provider"] = provider
        _configured["provider"].add_span_processor(SimpleSpanProcessor(exporter))


def _exporter_from_env() -> Any:
    name = os.environ.get(ENV, "").strip()
    if name in ("", "0", "off", "none"):
        return None
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise RuntimeError(f"{ENV}=otlp needs the opentelemetry-exporter-otlp-proto-http package "
                               "(pip install .[otlp])") from exc
        return OTLPSpanExporter()
    if name.startswith("jsonl:"):
        return _JsonLinesExporter(Path(name[len("jsonl:"):]))
    raise RuntimeError(f"{ENV} must be console, otlp or jsonl:DIR, got {name!r}")


def tracer() -> trace.Tracer:
    return trace.get_tracer("day0")


def current_job_id() -> str | None:
    """The job this thread works for: set by ``job_context``, else carried in the context's baggage."""
    return _job_id.get() or _str(baggage.get_baggage(JOB_ATTRIBUTE))


def _str(value: object) -> str | None:
    return None if value is None else str(value)


@contextmanager
def job_context(job_id: int | str | None) -> Iterator[None]:
    """Marks this thread's work as job ``job_id``'s: log lines and spans (and the baggage sent on) carry it."""
    if job_id is None:
        yield
        return
    token = _job_id.set(str(job_id))
    ctx_token = context.attach(baggage.set_baggage(JOB_ATTRIBUTE, str(job_id)))
    try:
        yield
    finally:
        context.detach(ctx_token)
        _job_id.reset(token)


@contextmanager
def span(name: str, job_id: int | str | None = None, kind: trace.SpanKind = trace.SpanKind.INTERNAL,
         parent: context.Context | None = None, **attributes: Any) -> Iterator[trace.Span]:
    """A span (current while the block runs) under ``parent`` (a context another process sent) or the current
    context; an exception leaving the block is recorded on it."""
    token = context.attach(parent) if parent is not None else None
    try:
        with job_context(job_id), tracer().start_as_current_span(name, kind=kind,
                                                                 attributes=_attrs(attributes)) as current:
            yield current
    finally:
        if token is not None:
            context.detach(token)


def _attrs(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, str | bool | int | float) else str(v) for k, v in values.items() if v is not None}


def inject(carrier: dict[str, str] | None = None) -> dict[str, str]:
    """The current context as headers (``traceparent``, ``baggage``): for a message or an HTTP request."""
    carrier = {} if carrier is None else carrier
    propagate.inject(carrier)
    return carrier


def extract(carrier: Mapping[str, Any] | Any) -> context.Context:
    """The context a message or request carried (a mapping, or an object with the headers as attributes)."""
    if not isinstance(carrier, Mapping):
        carrier = {k: getattr(carrier, k, None) for k in ("traceparent", "tracestate", "baggage")}
    return propagate.extract({k: v for k, v in carrier.items() if isinstance(v, str)})


def trace_id() -> str | None:
    ctx = trace.get_current_span().get_span_context()
    return f"{ctx.trace_id:032x}" if ctx.is_valid else None


@contextmanager
def request_context(request_id: str | None) -> Iterator[None]:
    token = _request_id.set(request_id)
    try:
        yield
    finally:
        _request_id.reset(token)


def _job_id_processor() -> Any:
    """A span processor giving every span started where a job is known ``day0.job_id`` (the SDK is imported
    only when tracing is on)."""
    from opentelemetry.sdk.trace import SpanProcessor

    class JobIdProcessor(SpanProcessor):
        def on_start(self, span: Any, parent_context: context.Context | None = None) -> None:
            job = _job_id.get() or _str(baggage.get_baggage(JOB_ATTRIBUTE, parent_context))
            if job is not None:
                span.set_attribute(JOB_ATTRIBUTE, job)

    return JobIdProcessor()


def log_context() -> str:
    """`` job=… trace=… request=…`` for the parts known here, or ""."""
    parts = [f"job={v}" for v in [current_job_id()] if v]
    parts += [f"trace={v}" for v in [trace_id()] if v]
    parts += [f"request={v}" for v in [_request_id.get()] if v]
    return " [" + " ".join(parts) + "]" if parts else ""


class ContextFormatter(logging.Formatter):
    """Formats as ``inner`` (or its own format) and appends the job, trace and request ids when known."""

    def __init__(self, fmt: str | None = None, datefmt: str | None = None, style: str = "%",
                 inner: logging.Formatter | None = None, **kwargs: Any) -> None:
        super().__init__(fmt, datefmt, style, **kwargs)  # type: ignore[arg-type]
        self.inner = inner

    def format(self, record: logging.LogRecord) -> str:
        text = self.inner.format(record) if self.inner is not None else super().format(record)
        return text + log_context()


def install_log_context(handlers: Sequence[logging.Handler] | None = None) -> None:
    """Wraps the formatters of ``handlers`` (the root logger's by default) so every line carries the context."""
    for handler in handlers if handlers is not None else logging.getLogger().handlers:
        if not isinstance(handler.formatter, ContextFormatter):
            handler.setFormatter(ContextFormatter(inner=handler.formatter or logging.Formatter()))


class _JsonLinesExporter:
    """Finished spans as JSON lines in ``DIR/spans-<pid>.jsonl`` (one file per process: no interleaving)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.lock = threading.Lock()

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.folder.mkdir(parents=True, exist_ok=True)
        lines = [json.dumps(span_record(s)) + "\n" for s in spans]
        with self.lock, open(self.folder / f"spans-{os.getpid()}.jsonl", "a") as out:
            out.writelines(lines)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def span_record(s: Any) -> dict[str, Any]:
    """The fields of a finished span that a reader of one trace needs."""
    ctx, parent = s.get_span_context(), s.parent
    return {"name": s.name, "trace_id": f"{ctx.trace_id:032x}", "span_id": f"{ctx.span_id:016x}",
            "parent_id": f"{parent.span_id:016x}" if parent is not None else None,
            "service": s.resource.attributes.get("service.name"), "attributes": dict(s.attributes or {}),
            "start": s.start_time, "end": s.end_time}
