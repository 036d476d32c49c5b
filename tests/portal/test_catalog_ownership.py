"""Catalog ownership: once another organization has evidence on a release, its visibility and release date
change only by staff (no squatting a slug to hide others' evidence behind an embargo); a slug that exists is a
409 naming its owner."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client

from apps.accounts.choices import Role
from apps.accounts.models import Membership
from tests.factories import (
    HardwareFactory,
    JobFactory,
    ModelReleaseFactory,
    OrganizationFactory,
    UserFactory,
    auth,
    make_token,
    tiny_config,
)
from tests.portal.reports import bound, passing

pytestmark = pytest.mark.django_db

FAR = "2099-01-01T00:00:00Z"


@pytest.fixture
def world() -> dict[str, Any]:
    """A public release of 'maker'; 'vendor' owns an accelerator and an agent token for it."""
    maker, vendor = OrganizationFactory(slug="maker"), OrganizationFactory(slug="vendor")
    model = ModelReleaseFactory(slug="open-1b", organization=maker, visibility="public",
                                released_at=datetime(2026, 11, 1, tzinfo=UTC))
    hardware = HardwareFactory(slug="vendor-npu", organization=vendor)
    return {"maker": maker, "vendor": vendor, "model": model, "hardware": hardware,
            "admin": make_token(organization=maker, role=Role.ADMIN),
            "agent": make_token(organization=vendor, scopes=["agent"], hardware=hardware, role=Role.ADMIN)}


def _evidence(api_client: Any, w: dict[str, Any], *, organization: Any, hardware: Any = None, agent: Any = None) -> None:
    hardware = hardware or w["hardware"]
    job = JobFactory(model=w["model"], hardware=hardware, organization=organization, spec={"stages": ["plan"]})
    agent = agent or w["agent"]
    response = api_client.post(f"/api/v1/jobs/{job.pk}/results/", bound(job, {"stage": "plan",
                               "section": passing("plan")}), format="json", **auth(agent))
    assert response.status_code == 201, response.content


def _patch(client: Any, w: dict[str, Any], body: dict[str, Any], token: Any = None) -> Any:
    url = f"/api/v1/models/{w['model'].slug}/"
    if token is None:  # a signed-in session (django.test.Client)
        return client.patch(url, body, content_type="application/json")
    return client.patch(url, body, format="json", **auth(token))


@pytest.mark.parametrize("body", [{"visibility": "private"}, {"released_at": FAR},
                                  {"visibility": "private", "released_at": FAR}])
def test_the_owner_cannot_embargo_a_release_others_have_evidence_on(api_client, world, body) -> None:
    w = world
    _evidence(api_client, w, organization=w["vendor"])
    refused = _patch(api_client, w, body, w["admin"])
    assert refused.status_code == 403, refused.content
    detail = refused.json()["detail"]
    assert "open-1b has evidence from other organizations (vendor)" in detail and "change only by staff" in detail
    w["model"].refresh_from_db()
    assert w["model"].visibility == "public" and w["model"].released_at.year == 2026
    other = api_client.get("/api/v1/cells/open-1b/vendor-npu/", **auth(make_token(organization=w["vendor"])))
    assert other.status_code == 200  # the vendor still sees its evidence
    assert _patch(api_client, w, {"name": "Open 1B v2", "visibility": "public"}, w["admin"]).status_code == 200
    staff = UserFactory(is_staff=True)
    Membership.objects.create(organization=w["maker"], user=staff, role=Role.ADMIN)
    session = Client()
    session.force_login(staff)
    assert _patch(session, w, body).status_code == 200  # staff decide


@pytest.mark.parametrize("whose", ["own", "shared hardware, own job", "another organization's job on shared hardware",
                                   "own job on another organization's hardware"])
def test_which_evidence_locks_the_release(api_client, world, whose) -> None:
    w = world
    shared = HardwareFactory(slug="shared-cpu")
    own_hw = HardwareFactory(slug="maker-npu", organization=w["maker"])
    own_agent = make_token(organization=w["maker"], scopes=["agent"], hardware=own_hw, role=Role.ADMIN)
    shared_agent = make_token(organization=w["maker"], scopes=["agent"], hardware=shared, role=Role.ADMIN)
    locked = {"own": False, "shared hardware, own job": False,
              "another organization's job on shared hardware": True,
              "own job on another organization's hardware": True}[whose]
    if whose == "own":
        _evidence(api_client, w, organization=w["maker"], hardware=own_hw, agent=own_agent)
    elif whose == "shared hardware, own job":
        _evidence(api_client, w, organization=w["maker"], hardware=shared, agent=shared_agent)
    elif whose == "another organization's job on shared hardware":
        _evidence(api_client, w, organization=w["vendor"], hardware=shared, agent=shared_agent)
    else:
        _evidence(api_client, w, organization=w["maker"])
    answer = _patch(api_client, w, {"visibility": "private"}, w["admin"])
    assert answer.status_code == (403 if locked else 200), answer.content


def test_a_taken_slug_is_a_409_naming_its_owner(api_client, world) -> None:
    w = world
    squatter = make_token(organization=w["vendor"], role=Role.ADMIN)
    taken = api_client.post("/api/v1/models/", {"slug": "open-1b", "name": "Mine", "config": tiny_config()},
                            format="json", **auth(squatter))
    assert taken.status_code == 409 and taken.json()["detail"] == (
        "model slug 'open-1b' exists: it belongs to organization maker")
    hardware = api_client.post("/api/v1/hardware/", {"slug": "vendor-npu", "vendor": "X", "name": "X",
                                                     "memory_bytes": 1, "devices_per_node": 1},
                               format="json", **auth(w["admin"]))
    assert hardware.status_code == 409 and "belongs to organization vendor" in hardware.json()["detail"]
