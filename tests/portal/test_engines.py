"""Engines: the catalog's seeded engines over REST, a job naming one (stored, shown, validated, carried to the
agent in its spec), and dispatch that waits, saying so, until an online agent of the hardware has the engine."""

from __future__ import annotations

import pytest
from django.test import Client
from django.utils import timezone

from apps.catalog.engines import ensure_builtin_engines
from apps.fleet.models import Agent
from apps.jobs import dispatch, services
from apps.jobs.choices import JobState
from apps.jobs.dispatch import task_payload
from apps.jobs.models import Job
from contract.jobspec import JobSpec, JobSpecError
from tests.factories import HardwareFactory, ModelReleaseFactory, OrganizationFactory, UserFactory, auth, make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def setup() -> tuple:
    ensure_builtin_engines()
    org = OrganizationFactory()
    return ModelReleaseFactory(organization=org), HardwareFactory(), make_token(organization=org)


def _agent(hardware, hostname: str = "host", **capabilities) -> Agent:
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    return Agent.objects.create(hardware=hardware, hostname=hostname, token=token, last_heartbeat_at=timezone.now(),
                                capabilities=capabilities)


def test_the_seeded_engines_are_listed_and_found_by_name_and_version(api_client, setup) -> None:
    token = setup[2]
    rows = api_client.get("/api/v1/engines/", **auth(token)).json()
    rows = rows.get("results", rows) if isinstance(rows, dict) else rows
    refs = {row["ref"]: row for row in rows}
    assert {"day0", "vllm@0.32.0", "openai-compatible"} <= set(refs)
    assert refs["day0"]["default"] is True and refs["vllm@0.32.0"]["executable"] == "vllm"
    assert "{model_path}" in refs["vllm@0.32.0"]["command"] and refs["vllm@0.32.0"]["capabilities"]["logprobs"]
    detail = api_client.get("/api/v1/engines/vllm@0.32.0/", **auth(token))
    assert detail.status_code == 200 and detail.json()["version"] == "0.32.0"
    assert api_client.get("/api/v1/engines/vllm@9.9/", **auth(token)).status_code == 404


def test_only_staff_add_an_engine(api_client, setup) -> None:
    body = {"name": "sglang", "version": "0.5.0", "executable": "sglang", "obtained_by": "sglang==0.5.0",
            "command": "python -m sglang.launch_server --model-path {model_path} --port {port}",
            "capabilities": {"logprobs": True}}
    assert api_client.post("/api/v1/engines/", body, format="json", **auth(setup[2])).status_code == 403
    staff = Client()
    staff.force_login(UserFactory(is_staff=True))
    bad = staff.post("/api/v1/engines/", {**body, "command": "serve {model} --port {port}"},
                     content_type="application/json")
    assert bad.status_code == 400 and "unknown placeholder {model}" in bad.content.decode()
    made = staff.post("/api/v1/engines/", body, content_type="application/json")
    assert made.status_code == 201, made.content
    assert made.json()["ref"] == "sglang@0.5.0"
    again = staff.post("/api/v1/engines/", body, content_type="application/json")
    assert again.status_code == 400  # one row per name and version


def test_a_job_without_an_engine_is_unchanged(api_client, setup, monkeypatch) -> None:
    model, hardware, token = setup
    monkeypatch.setattr(services, "do_dispatch_job", lambda job_id: None)
    data = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug}, format="json",
                           **auth(token)).json()
    assert "engine" not in data["spec"] and data["engine"] == "day0"
    day0 = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug, "engine": "day0"},
                           format="json", **auth(token)).json()
    assert "engine" not in day0["spec"] and day0["engine"] == "day0"


@pytest.mark.parametrize(("body", "message"), [
    ({"engine": "tensorrt"}, "no engine 'tensorrt' in the catalog"),
    ({"engine": "vllm@0.1.0"}, "no engine 'vllm@0.1.0' in the catalog"),
    ({"engine": "Bad Name"}, "engine name"),
    ({"engine": "openai-compatible"}, "has no command of its own"),
    ({"engine": "openai-compatible", "engine_command": "srv {model} {port}"}, "unknown placeholder {model}"),
])
def test_a_job_naming_an_unknown_engine_is_400_naming_it(api_client, setup, body, message) -> None:
    model, hardware, token = setup
    response = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug, **body},
                               format="json", **auth(token))
    assert response.status_code == 400 and message in response.content.decode(), response.content


def test_a_job_naming_an_engine_waits_until_an_online_agent_has_it(api_client, setup, monkeypatch,
                                                                   django_capture_on_commit_callbacks) -> None:
    model, hardware, token = setup
    sent: list[dict] = []
    monkeypatch.setattr(dispatch, "send_job", lambda job, nodes=(): sent.append(task_payload(job)))
    _agent(hardware, engines={})  # online, without vLLM
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug,
                                                     "engine": "vllm@0.32.0"},
                                   format="json", **auth(token))
    assert response.status_code == 201, response.content
    job = Job.objects.get(pk=response.json()["id"])
    assert job.state == JobState.QUEUED and sent == []
    shown = api_client.get(f"/api/v1/jobs/{job.pk}/", **auth(token)).json()
    assert shown["engine"] == "vllm@0.32.0" and shown["stuck"] is True
    assert "with engine vllm@0.32.0" in shown["waiting_reason"] and "none of its 1 online" in shown["waiting_reason"]
    assert job.events.filter(kind="waiting", data__engine="vllm").exists()
    page = Client()
    page.force_login(token.user)
    html = page.get(f"/jobs/{job.pk}/").content.decode()
    assert "<span data-engine>vllm@0.32.0</span>" in html and "Not claimed:</strong> waiting for an agent" in html
    _agent(hardware, "host-with-vllm", engines={"vllm": "/opt/vllm/bin/vllm"})
    services.do_dispatch_job(job.pk)
    job.refresh_from_db()
    assert job.state == JobState.DISPATCHED and len(sent) == 1
    spec = JobSpec.from_dict(sent[0])
    assert spec.engine["name"] == "vllm" and spec.engine["version"] == "0.32.0"
    assert spec.engine["command"].startswith("vllm serve {model_path} --port {port}")


def test_the_generic_engine_takes_the_submitters_command_and_runs_on_any_agent(api_client, setup, monkeypatch) -> None:
    model, hardware, token = setup
    sent: list[dict] = []
    monkeypatch.setattr(dispatch, "send_job", lambda job, nodes=(): sent.append(task_payload(job)))
    _agent(hardware)
    command = "python -m agents.runtime serve {model_path} --port {port} --dtype {dtype}"
    response = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug,
                                                 "engine": "openai-compatible", "engine_command": command},
                               format="json", **auth(token))
    assert response.status_code == 201, response.content
    services.do_dispatch_job(response.json()["id"])
    assert JobSpec.from_dict(sent[0]).engine["command"] == command


def test_a_malformed_engine_in_a_spec_is_named() -> None:
    with pytest.raises(JobSpecError, match="engine"):
        JobSpec.from_dict({"model": {}, "engine": {"name": 3}})
    with pytest.raises(JobSpecError, match="unknown placeholder"):
        JobSpec.from_dict({"model": {}, "engine": {"name": "x", "command": "run {nope}"}})
    assert JobSpec.from_dict({"model": {}}).engine is None


def test_a_multi_node_job_reserves_only_agents_with_its_engine(setup) -> None:
    from django.db import transaction

    from apps.jobs.placement import reserve_nodes
    from tests.factories import JobFactory

    model, hardware, _ = setup
    engine = {"name": "vllm", "version": "0.32.0", "executable": "vllm", "command": "vllm serve {model_path}"}
    job = JobFactory(model=model, hardware=hardware, state=JobState.QUEUED, nodes=2, spec={"engine": engine})
    without = _agent(hardware, "plain", engines={})
    first = _agent(hardware, "vllm-1", engines={"vllm": "vllm"})
    with transaction.atomic():
        nodes, waiting = reserve_nodes(job, 1)
    assert nodes == [] and "1 free" in waiting
    second = _agent(hardware, "vllm-2", engines={"vllm": "/opt/vllm"})
    with transaction.atomic():
        nodes, waiting = reserve_nodes(job, 1)
    assert waiting is None and {n.agent_id for n in nodes} == {first.pk, second.pk} and without.pk not in {
        n.agent_id for n in nodes}
