"""``day0 serve`` continues the caller's trace: a span per ``/v1`` request under the ``traceparent`` it was sent,
carrying the job id from ``baggage``, and its log lines name the request id, the trace id and the job."""

from __future__ import annotations

import io
import logging

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agents.runtime.engine import LLMEngine
from agents.runtime.server import create_app
from agents.runtime.server.launcher import ServerThread
from agents.runtime.testing.make_model import cached_model
from telemetry import tracing


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    tracing.add_exporter(exporter)
    yield exporter
    exporter.shutdown()  # later spans of this process go nowhere


def test_a_request_joins_the_callers_trace_and_logs_its_ids(spans):
    lines = io.StringIO()
    handler = logging.StreamHandler(lines)
    access = logging.getLogger("agents.runtime.server.access")
    access.addHandler(handler)
    access.setLevel(logging.DEBUG)
    tracing.install_log_context([handler])
    engine = LLMEngine(cached_model("llama"), num_blocks=32)
    try:
        with ServerThread(create_app(engine, "tiny-llama")) as url, tracing.span("stage serve", job_id=42) as stage:
            response = httpx.post(f"{url}/v1/completions", json={"prompt": "hi", "max_tokens": 2},
                                  headers={**tracing.inject(), "X-Request-Id": "req-7"}, timeout=60)
            assert response.status_code == 200
            httpx.get(f"{url}/metrics")  # probes are not traced
    finally:
        access.removeHandler(handler)
        access.setLevel(logging.NOTSET)
    caller = stage.get_span_context()
    served = [s for s in spans.get_finished_spans() if s.name == "POST /v1/completions"]
    assert len(served) == 1
    server = served[0]
    assert server.context.trace_id == caller.trace_id and server.parent.span_id == caller.span_id
    assert server.attributes["day0.job_id"] == "42" and server.attributes["day0.request_id"] == "req-7"
    assert server.attributes["http.response.status_code"] == 200
    assert not [s for s in spans.get_finished_spans() if "/metrics" in s.name]
    logged = lines.getvalue()
    assert f"job=42 trace={caller.trace_id:032x} request=req-7" in logged, logged


def test_without_an_exporter_tracing_stays_off(monkeypatch):
    monkeypatch.delenv(tracing.ENV, raising=False)
    assert tracing._exporter_from_env() is None
    monkeypatch.setenv(tracing.ENV, "zipkin")
    with pytest.raises(RuntimeError, match="console, otlp or jsonl"):
        tracing._exporter_from_env()
