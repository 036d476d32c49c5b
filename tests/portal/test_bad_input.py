"""Client input that makes no sense is answered with a 4xx naming the problem, never a 500: junk bodies, wrong
types, NUL characters, NaN, absurd sizes, junk queries."""

from __future__ import annotations

import json

import pytest

from apps.accounts.choices import Role
from apps.catalog.models import Hardware, ModelRelease
from apps.evidence.models import StageResult
from apps.fleet.models import Agent
from apps.jobs.models import Job, JobEvent
from tests.factories import HardwareFactory, JobFactory, OrganizationFactory, auth, make_token, tiny_config

pytestmark = pytest.mark.django_db

JUNK_BODIES = ['[]', '"text"', '42', 'null', '{"a": NaN}', '{"a": Infinity}', '{"s": "nul\\u0000here"}', '{',
               json.dumps({"slug": ["x"], "name": {"a": 1}, "config": "not json"}), json.dumps({"events": "x"}),
               json.dumps([{"seq": 2**70, "ts": "2026-01-01T00:00:00Z", "kind": "log"}]),
               json.dumps({"stage": "plan", "section": {"fits": True, "params_total": 2**80}}),
               json.dumps({"stages": {"bench": {"runs": [{"concurrency": 1, "ttft_ms": [1, 2]}]}}}),
               json.dumps({"model": None, "hardware": 5, "stages": "plan", "thresholds": {"x": "nan"}})]


def test_junk_is_a_400_naming_the_problem_and_stores_nothing(api_client) -> None:
    org = OrganizationFactory()
    hardware = HardwareFactory()
    job = JobFactory(hardware=hardware, organization=org)
    admin = make_token(organization=org, role=Role.ADMIN)
    agent = make_token(organization=org, scopes=["agent"], hardware=hardware)
    events = f"/api/v1/jobs/{job.pk}/events/"
    targets = [("/api/v1/models/", admin), ("/api/v1/hardware/", admin), ("/api/v1/jobs/", admin),
               (events, agent), (f"/api/v1/jobs/{job.pk}/results/", agent),
               (f"/api/v1/jobs/{job.pk}/state/", agent), ("/api/v1/agents/", agent)]
    counts = (ModelRelease.objects.count(), Hardware.objects.count(), Job.objects.count(), Agent.objects.count())
    state = job.state
    for url, token in targets:
        for body in JUNK_BODIES:
            response = api_client.generic("POST", url, body, content_type="application/json", **auth(token))
            if url == events and body == "[]":  # an empty batch is a valid one: nothing stored, nothing acknowledged
                assert (response.status_code, response.json()) == (200, {"acked": 0})
                continue
            assert response.status_code == 400, (url, body, response.status_code, response.content)
            problem = response.json()  # a field (or "detail", "non_field_errors") and the sentence about it
            assert isinstance(problem, dict) and problem and all(problem.values()), (url, body, problem)
    assert (ModelRelease.objects.count(), Hardware.objects.count(), Job.objects.count(),
            Agent.objects.count()) == counts
    assert not JobEvent.objects.filter(job=job).exists() and not StageResult.objects.filter(job=job).exists()
    job.refresh_from_db()
    assert job.state == state


def test_a_nul_character_is_a_400_naming_the_problem(api_client) -> None:
    token = make_token(organization=OrganizationFactory())
    body = json.dumps({"slug": "x", "name": "bad\u0000name", "config": tiny_config()})
    response = api_client.generic("POST", "/api/v1/models/", body, content_type="application/json", **auth(token))
    assert response.status_code == 400 and "NUL" in response.json()["detail"]


def test_absurd_config_sizes_are_refused_quickly(api_client) -> None:
    token = make_token(organization=OrganizationFactory())
    body = {"slug": "huge", "name": "Huge", "config": tiny_config(num_hidden_layers=10**9)}
    response = api_client.post("/api/v1/models/", body, format="json", **auth(token))
    assert response.status_code == 400 and "num_hidden_layers" in response.json()["config"][0]


@pytest.mark.parametrize(("url", "status", "says"), [
    ("/api/v1/jobs/abc/", 400, "job ids are integers, got 'abc'"),
    ("/api/v1/jobs/{job}/events/?after=-1", 400, '"after":["must be between 0'),
    ("/api/v1/models/?page=zz", 404, "Invalid page."),
    ("/api/v1/matrix/?tier=-1", 400, "must be 0-6 or a tier name"),
    ("/api/v1/jobs/?ordering=nope", 200, '"count":1,'),  # an unknown ordering is ignored
    ("/?tier=x&vendor=%00", 400, "must not contain NUL"),
    ("/cells/%00/x/", 400, "must not contain NUL"),
    ("/api/v1/agents/x/heartbeat/", 405, 'Method \\"GET\\" not allowed.'),
    # "²" passes str.isdigit() but not int(): numbers are checked with isdecimal(); the pages and the export
    # ignore a tier filter they cannot read and show everything
    ("/?tier=%C2%B2", 200, 'select name="tier"'),
    ("/day0/?tier=%C2%B2", 200, 'aria-label="Rank by tier"'),
    ("/export/matrix.csv?tier=%C2%B2", 200, "model,model_name,family,"),
    ("/api/v1/matrix/?tier=%C2%B2", 400, "must be 0-6 or a tier name"),
    ("/api/v1/jobs/%C2%B2/", 400, "job ids are integers"),
    ("/api/v1/agents/%C2%B2/", 404, "no agent with pk"),
])
def test_junk_queries_are_answered_with_the_status_and_sentence_they_deserve(api_client, url: str, status: int,
                                                                             says: str) -> None:
    org = OrganizationFactory()
    token = make_token(organization=org)
    response = api_client.get(url.format(job=JobFactory(organization=org).pk), **auth(token))
    assert response.status_code == status, (response.status_code, response.content[:300])
    assert says in response.content.decode(), response.content[:300]


def test_a_bad_matrix_tier_is_a_400_naming_the_parameter(api_client) -> None:
    token = make_token(organization=OrganizationFactory())
    response = api_client.get("/api/v1/matrix/?tier=%C2%B2", **auth(token))
    assert response.status_code == 400 and "tier name" in response.json()["tier"][0]
    assert api_client.get("/api/v1/matrix/?tier=serves", **auth(token)).status_code == 200


@pytest.mark.parametrize("pk", ["abc", "%C2%B2"])
def test_a_malformed_token_id_is_a_404_naming_it(api_client, pk: str) -> None:
    token = make_token(organization=OrganizationFactory())
    response = api_client.post(f"/api/v1/tokens/{pk}/revoke/", **auth(token))
    assert response.status_code == 404 and "no token with pk" in response.json()["detail"]
