"""A private (embargoed) model, its cells, jobs and evidence are its organization's only, until released."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

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
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def embargoed() -> tuple:
    org = OrganizationFactory(slug="secret-lab")
    model = ModelReleaseFactory(slug="next-big-1b", organization=org, visibility="private",
                                released_at=timezone.now() + timedelta(days=7))
    hardware = HardwareFactory()
    job = JobFactory(model=model, hardware=hardware, organization=org)
    return org, model, hardware, job


def _urls(model, hardware, job) -> list[str]:
    return [f"/api/v1/models/{model.slug}/", f"/api/v1/cells/{model.slug}/{hardware.slug}/",
            f"/api/v1/jobs/{job.pk}/", f"/api/v1/jobs/{job.pk}/events/"]


def test_other_organizations_and_anonymous_get_404(api_client, embargoed) -> None:
    _, model, hardware, job = embargoed
    outsider = make_token(organization=OrganizationFactory(), role=Role.ADMIN)
    for headers in ({}, auth(outsider)):
        for url in _urls(model, hardware, job):
            assert api_client.get(url, **headers).status_code == 404, url
        assert model.slug not in str(api_client.get("/api/v1/models/", **headers).json())
        assert model.slug not in str(api_client.get("/api/v1/matrix/", **headers).json())
        assert api_client.get("/api/v1/jobs/", **headers).json()["count"] == 0


def test_the_organization_sees_its_private_model(api_client, embargoed) -> None:
    org, model, hardware, job = embargoed
    viewer = make_token(organization=org, role=Role.VIEWER, scopes=["read"])
    for url in _urls(model, hardware, job):
        assert api_client.get(url, **auth(viewer)).status_code == 200, url
    assert model.slug in str(api_client.get("/api/v1/matrix/", **auth(viewer)).json())


def test_the_matrix_page_hides_private_models_from_other_users(client, embargoed) -> None:
    org, model, hardware, _ = embargoed
    public = ModelReleaseFactory(slug="open-1b")
    outsider = UserFactory()
    Membership.objects.create(organization=OrganizationFactory(), user=outsider, role=Role.ADMIN)
    client.force_login(outsider)
    page = client.get("/").content.decode()
    assert "next-big-1b" not in page and public.slug in page and hardware.slug in page
    assert client.get(f"/cells/{model.slug}/{hardware.slug}/").status_code == 404
    member = UserFactory()
    Membership.objects.create(organization=org, user=member, role=Role.VIEWER)
    client.force_login(member)
    assert "next-big-1b" in client.get("/").content.decode()
    assert client.get(f"/cells/{model.slug}/{hardware.slug}/").status_code == 200


def test_release_time_lifts_the_embargo(api_client, embargoed) -> None:
    _, model, _, _ = embargoed
    model.released_at = timezone.now() - timedelta(minutes=1)
    model.save()
    assert api_client.get(f"/api/v1/models/{model.slug}/").status_code == 200


def test_viewers_read_submitters_submit(api_client) -> None:
    org = OrganizationFactory()
    model, hardware = ModelReleaseFactory(organization=org), HardwareFactory()
    body = {"model": model.slug, "hardware": hardware.slug}
    viewer = make_token(organization=org, role=Role.VIEWER, scopes=["read"])
    assert api_client.post("/api/v1/jobs/", body, format="json", **auth(viewer)).status_code == 403
    submitter = make_token(organization=org, role=Role.SUBMITTER)
    assert api_client.post("/api/v1/jobs/", body, format="json", **auth(submitter)).status_code == 201
    # a submit token whose user was demoted to viewer no longer submits
    Membership.objects.filter(user=submitter.user).update(role=Role.VIEWER)
    assert api_client.post("/api/v1/jobs/", body, format="json", **auth(submitter)).status_code == 403


def test_outsiders_cannot_submit_jobs_on_a_private_model(api_client, embargoed) -> None:
    _, model, hardware, _ = embargoed
    outsider = make_token(organization=OrganizationFactory(), role=Role.ADMIN)
    response = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug}, format="json",
                               **auth(outsider))
    assert response.status_code == 400 and "next-big-1b" in response.json()["model"][0]


def test_another_organizations_agent_token_never_sees_an_embargoed_job(api_client, embargoed) -> None:
    from apps.fleet.models import Agent
    from apps.jobs.models import Job

    _, model, hardware, job = embargoed
    # a token minted for this shared hardware by another organization's admin before only staff could
    agent_token = make_token(organization=OrganizationFactory(), role=Role.ADMIN, scopes=["agent"],
                             hardware=hardware)
    for url in (f"/api/v1/jobs/{job.pk}/", f"/api/v1/jobs/{job.pk}/events/"):
        assert api_client.get(url, **auth(agent_token)).status_code == 404, url  # running, on its queue: still not
    assert model.slug not in str(api_client.get("/api/v1/jobs/", **auth(agent_token)).json())
    ran_it = Agent.objects.create(hardware=hardware, hostname="gpu-host-1", token=agent_token)
    Job.objects.filter(pk=job.pk).update(agent=ran_it, state="succeeded")
    assert api_client.get(f"/api/v1/jobs/{job.pk}/", **auth(agent_token)).status_code == 404
