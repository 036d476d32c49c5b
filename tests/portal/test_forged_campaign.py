"""Holes found by a by-hand forgery campaign over REST with a real agent token (the lead's closing note keeps the
table of attempts): each is refused with a 4xx naming what was wrong, stores nothing, and leaves the cell's tier
where it was."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from apps.accounts.choices import Role
from apps.catalog.models import Hardware
from apps.evidence.models import StageResult
from apps.fleet.models import Agent
from apps.jobs.choices import JobState
from apps.jobs.models import Job, JobEvent
from apps.matrix.models import Cell
from contract.events import EVENT_MESSAGE_MAX
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token
from tests.portal.forger import agent_cell, climb_to, post_result
from tests.portal.reports import passing

pytestmark = pytest.mark.django_db


@pytest.fixture
def cell() -> tuple:
    return agent_cell()





def _tier(model: Any, hardware: Any) -> int:
    return Cell.objects.get(model=model, hardware=hardware).tier


def _load_with(**shard: Any) -> dict[str, Any]:
    section = passing("load")
    section["shards"][0].update(shard)
    return section


def _shard_twice() -> dict[str, Any]:
    section = passing("load")
    section["shards"].append(dict(section["shards"][0]))
    return section


# (case, result document, the field the 400 names, a phrase of its message)
REFUSED_DOCUMENTS: list[tuple[str, dict[str, Any], str, str]] = [
    ("a shard named with a path", {"stage": "load", "section": _load_with(file="../../etc/passwd")},
     "stages.load.shards[0].file", "must be a file name without directories"),
    ("a shard named with a control character", {"stage": "load", "section": _load_with(file="a\x07.safetensors")},
     "stages.load.shards[0].file", "without control characters"),
    ("a shard digest that is no sha256", {"stage": "load", "section": _load_with(sha256="zz")},
     "stages.load.shards[0].sha256", "must be 64 hexadecimal digits"),
    ("a shard listed twice", {"stage": "load", "section": _shard_twice()},
     "stages.load.shards[2].file", "'model-00001-of-00002.safetensors' is listed twice"),
    ("a report's failed stage that is no stage", {"stages": {"load": passing("load")}, "failed_stage": "../x<b>"},
     "failed_stage", "'../x<b>' is not a stage; a failed stage is one of plan, load"),
    ("a report's error of 2 MB", {"stages": {"load": passing("load")}, "error": "E" * 2_000_000},
     "error", f"is 2000000 characters long; a job's error is at most {EVENT_MESSAGE_MAX}"),
]


@pytest.mark.parametrize(("case", "doc", "field", "message"), REFUSED_DOCUMENTS, ids=[c[0] for c in REFUSED_DOCUMENTS])
def test_a_forged_result_document_is_400_naming_the_field_and_stores_nothing(api_client, cell, case, doc, field,
                                                                             message) -> None:
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware)
    climb_to(api_client, job, token, 1)
    response = post_result(api_client, job, token, doc)
    assert response.status_code == 400, response.content
    assert message in str(response.json()[field]), response.json()
    assert not StageResult.objects.filter(job=job, stage="load").exists()
    job.refresh_from_db()
    assert job.failed_stage == "" and job.error == ""
    assert _tier(model, hardware) == 1
    # the honest section still goes in, in the same attempt: the refusal took nothing
    response = post_result(api_client, job, token, {"stage": "load", "section": passing("load")})
    assert response.status_code == 201 and response.json()["cell"]["tier"] == 2


def test_a_failed_stage_that_is_no_stage_is_400_and_the_job_keeps_running(api_client, cell) -> None:
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware)
    url = f"/api/v1/jobs/{job.pk}/state/"
    response = api_client.post(url, {"state": "failed", "failed_stage": "<script>x", "error": "e"}, format="json",
                               **auth(token))
    assert response.status_code == 400, response.content
    assert "'<script>x' is not a stage" in str(response.json()["failed_stage"])
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING
    response = api_client.post(url, {"state": "failed", "failed_stage": "agent", "error": "e"}, format="json",
                               **auth(token))
    assert response.status_code == 200 and response.json()["failed_stage"] == "agent", response.content


def _event(seq: int, **changes: Any) -> dict[str, Any]:
    return {"seq": seq, "ts": datetime(2026, 1, 1, tzinfo=UTC).isoformat(), "stage": "plan", "kind": "log",
            "level": "info", "message": "m", "data": {}, **changes}


@pytest.mark.parametrize(("change", "field", "message"), [
    ({"stage": "../../x"}, "events[1].stage", "'../../x' is not a stage of job"),
    # a stage the job never asked for cannot show as run on its page
    ({"stage": "bench", "kind": "stage_finished", "data": {"passed": True}}, "events[1].stage",
     "'bench' is not a stage of job"),
    ({"kind": "<b>x</b>"}, "events[1].kind", "must be a non-empty name of at most 32 letters"),
    ({"message": "m" * (EVENT_MESSAGE_MAX + 1)}, "events[1].message",
     f"is {EVENT_MESSAGE_MAX + 1} characters long; an event's message is at most {EVENT_MESSAGE_MAX}"),
])
def test_a_forged_event_is_400_naming_it_and_the_batch_stores_nothing(api_client, cell, change, field,
                                                                      message) -> None:
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware, spec={"stages": ["plan", "load"], "dtype": "bfloat16"})
    response = api_client.post(f"/api/v1/jobs/{job.pk}/events/", [_event(1), _event(2, **change)], format="json",
                               **auth(token))
    assert response.status_code == 400 and message in str(response.json()[field]), response.content
    assert not JobEvent.objects.filter(job=job).exists() and Job.objects.get(pk=job.pk).events_acked == 0
    # the job's own stages and none are taken
    ok = [_event(1), _event(2, stage="load"), _event(3, stage="")]
    assert api_client.post(f"/api/v1/jobs/{job.pk}/events/", ok, format="json", **auth(token)).json() == {"acked": 3}


@pytest.mark.parametrize(("state", "status"), [(JobState.SUCCEEDED, 409), (JobState.FAILED, 409),
                                               (JobState.CANCELLED, 200), (JobState.LOST, 200)])
def test_events_after_the_agent_finished_the_job_are_409(api_client, cell, state, status) -> None:
    """The agent flushes its log before it reports the final state: a later event is a forgery (or a stale
    replay). A cancelled or lost job was ended by the portal while its agent ran: its last lines are kept."""
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware, state=state)
    response = api_client.post(f"/api/v1/jobs/{job.pk}/events/", [_event(1)], format="json", **auth(token))
    assert response.status_code == status, response.content
    if status == 409:
        assert f"job {job.pk} is {state}: its event log is closed" in response.json()["detail"]
    assert JobEvent.objects.filter(job=job).exists() is (status == 200)


@pytest.mark.parametrize("bandwidth", [0, 1e30])
def test_a_bandwidth_no_device_has_is_400(api_client, bandwidth) -> None:
    org = OrganizationFactory()
    hardware = HardwareFactory(organization=org)
    owner = make_token(organization=org, role=Role.ADMIN)
    response = api_client.patch(f"/api/v1/hardware/{hardware.slug}/", {"memory_bandwidth_gbps": bandwidth},
                                format="json", **auth(owner))
    assert response.status_code == 400, response.content
    assert "is not a device's memory bandwidth" in str(response.json()["memory_bandwidth_gbps"])
    assert Hardware.objects.get(pk=hardware.pk).memory_bandwidth_gbps == 3350.0


def test_clearing_its_own_hardwares_bandwidth_does_not_lift_the_physics_floor(api_client) -> None:
    """The owner of a hardware entry clears its memory bandwidth so that a bench with an impossible TPOT has no
    floor to fail: on owned hardware the bench is then incomplete, naming why, and the tier stays."""
    org = OrganizationFactory()
    hardware = HardwareFactory(organization=org)
    model = ModelReleaseFactory()
    owner = make_token(organization=org, role=Role.ADMIN)
    token = make_token(organization=org, scopes=["agent"], hardware=hardware)
    job = JobFactory(model=model, hardware=hardware)
    climb_to(api_client, job, token, 4)
    response = api_client.patch(f"/api/v1/hardware/{hardware.slug}/", {"memory_bandwidth_gbps": None},
                                format="json", **auth(owner))
    assert response.status_code == 200, response.content
    fast = {"mean": 0.001, "p50": 0.001, "p90": 0.001, "p99": 0.001}
    bench = passing("bench")
    for run in bench["runs"]:
        run.update(tpot_ms=dict(fast), itl_ms=dict(fast))
    body = post_result(api_client, job, token, {"stage": "bench", "section": bench}).json()
    stored = body["stored"][0]
    assert stored["verdict"] == "incomplete", stored
    assert ("bench: the hardware states no memory bandwidth, so the TPOT floor cannot be checked (its owner sets "
            "memory_bandwidth_gbps)") in stored["reasons"]
    assert body["cell"]["tier"] == 4 and _tier(model, hardware) == 4


def test_an_agents_capabilities_or_versions_past_64_kib_are_400_and_not_stored(api_client, cell) -> None:
    """Every agent list and every dispatch reads them: a forger's 5 MB blob is refused, naming the field."""
    _, hardware, token = cell
    blob = {"x": "c" * 70_000}
    url = "/api/v1/agents/"
    response = api_client.post(url, {"hostname": "big", "hardware": hardware.slug, "capabilities": blob},
                               format="json", **auth(token))
    assert response.status_code == 400 and "at most 65536 are stored" in str(response.json()["capabilities"])
    assert not Agent.objects.filter(hostname="big").exists()
    agent = api_client.post(url, {"hostname": "node-1", "hardware": hardware.slug, "capabilities": {"devices": 8}},
                            format="json", **auth(token)).json()
    response = api_client.post(f"{url}{agent['id']}/heartbeat/", {"versions": blob}, format="json", **auth(token))
    assert response.status_code == 400 and "at most 65536 are stored" in str(response.json()["versions"])
    assert Agent.objects.get(pk=agent["id"]).versions == {}


def test_a_failed_stage_the_job_never_ran_is_400_and_changes_nothing(api_client, cell) -> None:
    """A job that asked for plan and load cannot fail at eval (the cell would show, and wait on, a stage it never
    ran), nor name a failed stage when it succeeded; by state or by its stage report alike."""
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware, spec={"stages": ["plan", "load"], "dtype": "bfloat16"})
    climb_to(api_client, job, token, 1)
    report = {"stages": {"load": passing("load")}, "failed_stage": "eval", "error": "e"}
    response = post_result(api_client, job, token, report)
    assert response.status_code == 400, response.content
    assert "'eval' is not a stage of the job (its stages: plan, load; or 'agent')" in str(response.json()["failed_stage"])
    assert not StageResult.objects.filter(job=job, stage="load").exists()
    url = f"/api/v1/jobs/{job.pk}/state/"
    for body, message in (({"state": "failed", "failed_stage": "eval", "error": "e"}, "'eval' is not a stage of the job"),
                          ({"state": "succeeded", "failed_stage": "load"}, "a succeeded report names no failed stage")):
        response = api_client.post(url, body, format="json", **auth(token))
        assert response.status_code == 400 and message in str(response.json()["failed_stage"]), response.content
        job.refresh_from_db()
        assert job.state == JobState.RUNNING and job.failed_stage == ""
    assert _tier(model, hardware) == 1
    response = api_client.post(url, {"state": "failed", "failed_stage": "load", "error": "e"}, format="json",
                               **auth(token))
    assert response.status_code == 200 and response.json()["failed_stage"] == "load", response.content


def test_a_claim_naming_a_failed_stage_is_400_and_the_job_stays_dispatched(api_client, cell) -> None:
    model, hardware, token = cell
    agent = api_client.post("/api/v1/agents/", {"hostname": "n1", "hardware": hardware.slug}, format="json",
                            **auth(token)).json()["id"]
    job = JobFactory(model=model, hardware=hardware, state=JobState.DISPATCHED)
    url = f"/api/v1/jobs/{job.pk}/state/"
    body = {"state": "running", "agent": agent, "attempt": 1}
    response = api_client.post(url, {**body, "failed_stage": "load"}, format="json", **auth(token))
    assert response.status_code == 400, response.content
    assert "a running report names no failed stage" in str(response.json()["failed_stage"])
    job.refresh_from_db()
    assert job.state == JobState.DISPATCHED and job.failed_stage == ""
    assert api_client.post(url, body, format="json", **auth(token)).status_code == 200
