"""Agents register with an agent token bound to their hardware, heartbeat, and are listed."""

from __future__ import annotations

import pytest

from apps.fleet.models import Agent
from tests.factories import HardwareFactory, JobFactory, OrganizationFactory, auth, make_token

pytestmark = pytest.mark.django_db


def test_register_is_idempotent_per_host_and_heartbeats_keep_it_online(api_client) -> None:
    hardware = HardwareFactory()
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    body = {"hostname": "node-7", "hardware": hardware.slug, "capabilities": {"devices": 8},
            "versions": {"torch": "2.13.0"}}
    first = api_client.post("/api/v1/agents/", body, format="json", **auth(token))
    assert first.status_code == 201 and first.json()["online"] is True
    again = api_client.post("/api/v1/agents/", dict(body, versions={"torch": "2.14.0"}), format="json", **auth(token))
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]
    assert Agent.objects.get().versions == {"torch": "2.14.0"}
    job = JobFactory(hardware=hardware)
    beat = api_client.post(f"/api/v1/agents/{first.json()['id']}/heartbeat/", {"current_job": job.pk},
                           format="json", **auth(token))
    assert beat.status_code == 200 and beat.json()["current_job"] == job.pk
    listed = api_client.get(f"/api/v1/agents/?hardware={hardware.slug}", **auth(token)).json()
    assert [a["hostname"] for a in listed["results"]] == ["node-7"]


def test_only_agent_tokens_of_that_hardware_register_or_beat(api_client) -> None:
    hardware = HardwareFactory()
    submit = make_token(organization=OrganizationFactory())
    assert api_client.post("/api/v1/agents/", {"hostname": "h"}, format="json", **auth(submit)).status_code == 403
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    wrong = api_client.post("/api/v1/agents/", {"hostname": "h", "hardware": HardwareFactory().slug}, format="json",
                            **auth(token))
    assert wrong.status_code == 403
    agent_id = api_client.post("/api/v1/agents/", {"hostname": "h"}, format="json", **auth(token)).json()["id"]
    other = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=HardwareFactory())
    refused = api_client.post(f"/api/v1/agents/{agent_id}/heartbeat/", {}, format="json", **auth(other))
    assert refused.status_code == 404  # another organization's agent is not even visible
    assert api_client.get("/api/v1/agents/").status_code == 401


def test_an_agent_token_dies_with_its_creators_membership(api_client) -> None:
    from apps.accounts.models import Membership

    hardware = HardwareFactory()
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    assert api_client.post("/api/v1/agents/", {"hostname": "h"}, format="json", **auth(token)).status_code == 201
    Membership.objects.filter(user=token.user).delete()
    assert api_client.post("/api/v1/agents/", {"hostname": "h"}, format="json", **auth(token)).status_code == 403


def test_members_see_only_their_organizations_agents(api_client) -> None:
    org = OrganizationFactory()
    hardware = HardwareFactory()
    agent_token = make_token(organization=org, scopes=["agent"], hardware=hardware)
    api_client.post("/api/v1/agents/", {"hostname": "vendor-node"}, format="json", **auth(agent_token))
    member = make_token(organization=org, scopes=["read"])
    outsider = make_token(organization=OrganizationFactory(), scopes=["read"])
    assert api_client.get("/api/v1/agents/", **auth(member)).json()["count"] == 1
    assert api_client.get("/api/v1/agents/", **auth(outsider)).json()["count"] == 0
