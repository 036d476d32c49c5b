"""No client input produces a 500: junk bodies, wrong types, NUL characters, NaN, absurd sizes."""

from __future__ import annotations

import json

import pytest

from apps.accounts.choices import Role
from tests.factories import HardwareFactory, JobFactory, OrganizationFactory, auth, make_token, tiny_config

pytestmark = pytest.mark.django_db

JUNK_BODIES = ['[]', '"text"', '42', 'null', '{"a": NaN}', '{"a": Infinity}', '{"s": "nul\\u0000here"}', '{',
               json.dumps({"slug": ["x"], "name": {"a": 1}, "config": "not json"}), json.dumps({"events": "x"}),
               json.dumps([{"seq": 2**70, "ts": "2026-01-01T00:00:00Z", "kind": "log"}]),
               json.dumps({"stage": "plan", "section": {"fits": True, "params_total": 2**80}}),
               json.dumps({"stages": {"bench": {"runs": [{"concurrency": 1, "ttft_ms": [1, 2]}]}}}),
               json.dumps({"model": None, "hardware": 5, "stages": "plan", "thresholds": {"x": "nan"}})]


def test_junk_never_causes_a_server_error(api_client) -> None:
    org = OrganizationFactory()
    hardware = HardwareFactory()
    job = JobFactory(hardware=hardware, organization=org)
    admin = make_token(organization=org, role=Role.ADMIN)
    agent = make_token(organization=org, scopes=["agent"], hardware=hardware)
    targets = [("/api/v1/models/", admin), ("/api/v1/hardware/", admin), ("/api/v1/jobs/", admin),
               (f"/api/v1/jobs/{job.pk}/events/", agent), (f"/api/v1/jobs/{job.pk}/results/", agent),
               (f"/api/v1/jobs/{job.pk}/state/", agent), ("/api/v1/agents/", agent)]
    for url, token in targets:
        for body in JUNK_BODIES:
            response = api_client.generic("POST", url, body, content_type="application/json", **auth(token))
            assert response.status_code < 500, (url, body, response.status_code, response.content)


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


@pytest.mark.parametrize("url", ["/api/v1/jobs/abc/", "/api/v1/jobs/1/events/?after=-1", "/api/v1/models/?page=zz",
                                 "/api/v1/matrix/?tier=-1", "/api/v1/jobs/?ordering=nope", "/?tier=x&vendor=%00",
                                 "/cells/%00/x/", "/api/v1/agents/x/heartbeat/",
                                 # "²" passes str.isdigit() but not int(): numbers are checked with isdecimal()
                                 "/?tier=%C2%B2", "/day0/?tier=%C2%B2", "/export/matrix.csv?tier=%C2%B2",
                                 "/api/v1/matrix/?tier=%C2%B2", "/api/v1/jobs/%C2%B2/", "/api/v1/agents/%C2%B2/"])
def test_junk_queries_are_answered_without_a_server_error(api_client, url: str) -> None:
    token = make_token(organization=OrganizationFactory())
    assert api_client.get(url, **auth(token)).status_code < 500


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
