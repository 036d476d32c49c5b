"""A job on the real stack (a portal of its own under uvicorn, Redis as broker and counter store, ``day0 agent``,
``day0 serve`` started by the serve stage) seen as an operator sees it: the portal's counters move, and every
process's spans form one trace from the REST submit to the runtime's requests, the job id on each."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from apps.jobs.models import Job
from apps.ops import store
from apps.ops.collectors import render
from tests.agents.conftest import PortalProcess, wait_for
from tests.agents.test_job_flow import cell, state_of, submit  # noqa: F401 (the cell fixture)

pytestmark = pytest.mark.django_db(transaction=True)
STAGES = ["plan", "load", "serve"]


def read_spans(folder: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(folder.glob("spans-*.jsonl")) for line in path.read_text().splitlines()]


def portal_samples() -> dict[tuple[str, frozenset], float]:
    """One scrape of the portal's metrics, rendered here: the same database, broker and Redis counters."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(render().decode()) for s in family.samples}


@pytest.fixture
def traced_portal(django_db_setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # noqa: ANN001
    folder = tmp_path / "spans"
    monkeypatch.setenv("DAY0_TRACING_EXPORTER", f"jsonl:{folder}")
    server = PortalProcess()
    server.start()
    try:
        yield server, folder
    finally:
        server.stop()


@pytest.mark.slow
def test_a_job_moves_the_portal_counters_and_leaves_one_trace(traced_portal, start_agent, cell) -> None:  # noqa: ANN001, F811
    portal, folder = traced_portal
    slug = cell.hardware.slug
    before = {name: store.read_counter(name) for name in ("events_ingested", "tier_changes")}
    job_id = submit(portal.url, cell, STAGES)
    depth = ("day0_portal_queue_depth", frozenset({"hardware": slug, "source": "broker"}.items()))
    assert portal_samples()[depth] == 1  # the message waits on hw.<slug> for an agent
    agent = start_agent(slug, cell.agent.secret, models_dir=cell.models_dir,
                        extra_env={"DAY0_TRACING_EXPORTER": f"jsonl:{folder}"})
    wait_for(lambda: state_of(job_id) in ("succeeded", "failed"), 300, "the job to finish", agent)
    job = Job.objects.get(pk=job_id)
    assert job.state == "succeeded", (job.failed_stage, job.error, agent.log())

    # counters shared through Redis by the portal process, read here
    ingested = store.read_counter("events_ingested").get((slug,), 0) - before["events_ingested"].get((slug,), 0)
    assert ingested >= 2 * len(STAGES)  # a start and a finish per stage at least
    assert store.read_counter("tier_changes").get((slug, "up"), 0) > before["tier_changes"].get((slug, "up"), 0)
    found = portal_samples()
    assert found[("day0_portal_jobs", frozenset({"state": "succeeded", "hardware": slug}.items()))] == 1
    assert found[("day0_portal_agents_online", frozenset({"hardware": slug}.items()))] == 1
    assert found[("day0_portal_event_ingest_lag_seconds_count", frozenset({"hardware": slug}.items()))] >= ingested
    assert found[depth] == 0  # taken by the agent

    def whole_trace() -> list[dict] | None:
        spans = read_spans(folder)
        return spans if any(s["name"] == "agent.run_job" for s in spans) else None

    spans = wait_for(whole_trace, 30, "the agent's task span to be written", agent)
    submit_span = next(s for s in spans if s["name"] == "POST /api/v1/jobs/")
    trace = [s for s in spans if s["trace_id"] == submit_span["trace_id"]]
    names = {s["name"] for s in trace}
    assert {"portal.dispatch", "agent.run_job", *(f"stage {stage}" for stage in STAGES),
            "POST /v1/completions"} <= names, sorted(names)
    assert {s["service"] for s in trace} >= {"day0-portal", "day0-agent", "day0-runtime"}
    assert all(s["attributes"].get("day0.job_id") == str(job_id) for s in trace), \
        [(s["name"], s["attributes"]) for s in trace if s["attributes"].get("day0.job_id") != str(job_id)]
    by_id = {s["span_id"]: s for s in trace}
    run = next(s for s in trace if s["name"] == "agent.run_job")
    assert by_id[run["parent_id"]]["name"] == "portal.dispatch"
    assert all(by_id[s["parent_id"]]["name"] == "agent.run_job" for s in trace if s["name"].startswith("stage "))
    served = [s for s in trace if s["name"] == "POST /v1/completions"]
    assert all(by_id[s["parent_id"]]["name"] == "stage serve" for s in served)
