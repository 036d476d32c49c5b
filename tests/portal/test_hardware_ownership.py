"""Hardware belongs to an organization (or is a shared catalog entry, staff's): who mints its agent tokens, who
edits it, which embargoed models run on it, and which embargoed jobs its agent tokens see."""

from __future__ import annotations

from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from apps.accounts.choices import Role
from apps.accounts.models import ApiToken, Membership
from apps.catalog.models import Hardware
from apps.jobs.models import Job
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


def _member(org, role: str = Role.ADMIN, **user_fields):
    user = UserFactory(**user_fields)
    Membership.objects.create(organization=org, user=user, role=role)
    return user


def _session(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _mint(client: Client, hardware: Hardware, org=None):
    body = {"name": "agent", "scopes": ["agent"], "hardware": hardware.slug}
    if org is not None:
        body["organization"] = org.slug
    return client.post("/api/v1/tokens/", body, content_type="application/json")


@pytest.fixture
def owned() -> tuple:
    """Hardware owned by 'acme', an admin of acme, and an admin of another organization."""
    acme = OrganizationFactory(slug="acme")
    hardware = HardwareFactory(slug="acme-npu", organization=acme)
    return acme, hardware, _member(acme), _member(OrganizationFactory(slug="rival"))


def test_only_the_owners_admins_or_staff_mint_agent_tokens_through_the_api(owned) -> None:
    acme, hardware, owner_admin, rival_admin = owned
    refused = _mint(_session(rival_admin), hardware)
    assert refused.status_code == 403
    assert "acme-npu" in refused.json()["detail"] and "only admins of acme or staff" in refused.json()["detail"]
    submitter = _member(acme, Role.SUBMITTER)
    assert _mint(_session(submitter), hardware).status_code == 403
    minted = _mint(_session(owner_admin), hardware)
    assert minted.status_code == 201 and minted.json()["hardware"] == "acme-npu"
    assert minted.json()["organization"] == "acme"
    staff = _member(acme, Role.VIEWER, is_staff=True)
    assert _mint(_session(staff), hardware, acme).status_code == 201
    assert ApiToken.objects.filter(hardware=hardware).count() == 2


def test_an_owned_hardwares_agent_tokens_belong_to_its_owner(owned) -> None:
    acme, hardware, owner_admin, _ = owned
    other = OrganizationFactory(slug="side-project")
    Membership.objects.create(organization=other, user=owner_admin, role=Role.ADMIN)
    refused = _mint(_session(owner_admin), hardware, other)
    assert refused.status_code == 403 and "belong to acme, not side-project" in refused.json()["detail"]


def test_shared_hardware_agent_tokens_are_staffs_only(api_client) -> None:
    org = OrganizationFactory(slug="ops")
    shared = HardwareFactory(slug="shared-gpu")
    refused = _mint(_session(_member(org)), shared)
    assert refused.status_code == 403 and "shared-gpu is a shared catalog entry" in refused.json()["detail"]
    staff = _member(org, Role.VIEWER, is_staff=True)
    minted = _mint(_session(staff), shared, org)
    assert minted.status_code == 201
    register = api_client.post("/api/v1/agents/", {"hostname": "h1"}, format="json",
                               HTTP_AUTHORIZATION=f"Token {minted.json()['token']}")
    assert register.status_code == 201 and register.json()["hardware"] == "shared-gpu"


def test_create_token_command_applies_the_same_rule(owned) -> None:
    acme, hardware, owner_admin, rival_admin = owned
    quiet = {"stdout": StringIO(), "stderr": StringIO()}
    rival = rival_admin.memberships.get().organization
    with pytest.raises(CommandError, match="acme-npu belongs to acme: only admins of acme or staff"):
        call_command("create_token", "--user", rival_admin.username, "--org", rival.slug, "--scopes", "agent",
                     "--hardware", hardware.slug, **quiet)
    shared = HardwareFactory(slug="shared-gpu")
    with pytest.raises(CommandError, match="shared-gpu is a shared catalog entry: only staff"):
        call_command("create_token", "--user", owner_admin.username, "--org", "acme", "--scopes", "agent",
                     "--hardware", shared.slug, **quiet)
    viewer = _member(acme, Role.VIEWER)
    with pytest.raises(CommandError, match="cannot grant the scopes"):
        call_command("create_token", "--user", viewer.username, "--org", "acme", "--scopes", "submit", **quiet)
    assert not ApiToken.objects.exists()
    out = StringIO()
    call_command("create_token", "--user", owner_admin.username, "--org", "acme", "--scopes", "agent",
                 "--hardware", hardware.slug, stdout=out, stderr=StringIO())
    assert ApiToken.objects.get().hardware == hardware and out.getvalue().startswith("d0_")


def test_only_the_owners_admins_or_staff_edit_hardware(api_client, owned) -> None:
    acme, hardware, owner_admin, rival_admin = owned
    url = f"/api/v1/hardware/{hardware.slug}/"
    rival = make_token(organization=rival_admin.memberships.get().organization, user=rival_admin)
    refused = api_client.patch(url, {"memory_bytes": 1}, format="json", **auth(rival))
    assert refused.status_code == 403 and "acme-npu belongs to acme" in refused.json()["detail"]
    owner = make_token(organization=acme, user=owner_admin)
    assert api_client.patch(url, {"memory_bytes": 96 * 10**9}, format="json", **auth(owner)).status_code == 200
    hardware.refresh_from_db()
    assert hardware.memory_bytes == 96 * 10**9
    moved = api_client.patch(url, {"organization": "rival"}, format="json", **auth(owner))
    assert moved.status_code == 403 and "only staff move" in moved.json()["detail"]
    shared = HardwareFactory(slug="shared-gpu")
    refused = api_client.patch("/api/v1/hardware/shared-gpu/", {"memory_bytes": 1}, format="json", **auth(owner))
    assert refused.status_code == 403 and "shared catalog entry: only staff edit it" in refused.json()["detail"]
    staff = _session(UserFactory(is_staff=True))
    edited = staff.patch("/api/v1/hardware/shared-gpu/", {"memory_bytes": 48 * 10**9},
                         content_type="application/json")
    assert edited.status_code == 200 and edited.json()["organization"] is None
    shared.refresh_from_db()
    assert shared.memory_bytes == 48 * 10**9


def test_new_hardware_belongs_to_its_creators_organization(api_client, owned) -> None:
    acme, _, owner_admin, _ = owned
    body = {"slug": "npu-2", "vendor": "Acme", "name": "NPU 2", "memory_bytes": 64 * 2**30, "devices_per_node": 8,
            "dtypes": ["bfloat16"]}
    owner = make_token(organization=acme, user=owner_admin)
    created = api_client.post("/api/v1/hardware/", body, format="json", **auth(owner))
    assert created.status_code == 201 and created.json()["organization"] == "acme"
    assert Hardware.objects.get(slug="npu-2").organization == acme
    shared = api_client.post("/api/v1/hardware/", dict(body, slug="npu-3", organization=None), format="json",
                             **auth(owner))
    assert shared.status_code == 403 and "only staff create shared hardware" in shared.json()["detail"]
    foreign = api_client.post("/api/v1/hardware/", dict(body, slug="npu-3", organization="rival"), format="json",
                              **auth(owner))
    assert foreign.status_code == 403 and "only admins of rival" in foreign.json()["detail"]
    ghost = api_client.post("/api/v1/hardware/", dict(body, slug="npu-3", organization="ghost"), format="json",
                            **auth(owner))
    assert ghost.status_code == 400 and "ghost" in ghost.json()["organization"][0]
    staff = _session(UserFactory(is_staff=True))
    created = staff.post("/api/v1/hardware/", dict(body, slug="npu-4"), content_type="application/json")
    assert created.status_code == 201 and created.json()["organization"] is None  # staff of no organization


@pytest.fixture
def embargoed_model():
    lab = OrganizationFactory(slug="secret-lab")
    return ModelReleaseFactory(slug="next-big-1b", organization=lab, visibility="private",
                               released_at=timezone.now() + timedelta(days=7))


def test_an_embargoed_model_runs_only_on_its_organizations_or_shared_hardware(api_client, embargoed_model) -> None:
    lab = embargoed_model.organization
    submitter = make_token(organization=lab, role=Role.SUBMITTER)
    HardwareFactory(slug="rival-npu", organization=OrganizationFactory(slug="rival"))
    refused = api_client.post("/api/v1/jobs/", {"model": "next-big-1b", "hardware": "rival-npu"}, format="json",
                              **auth(submitter))
    assert refused.status_code == 400
    message = refused.json()["hardware"][0]
    assert "next-big-1b is embargoed" in message and "rival-npu belongs to rival" in message
    for hardware in (HardwareFactory(organization=lab), HardwareFactory()):  # its own, shared
        response = api_client.post("/api/v1/jobs/", {"model": "next-big-1b", "hardware": hardware.slug},
                                   format="json", **auth(submitter))
        assert response.status_code == 201, response.content
    public = ModelReleaseFactory(organization=lab)
    response = api_client.post("/api/v1/jobs/", {"model": public.slug, "hardware": "rival-npu"}, format="json",
                               **auth(submitter))
    assert response.status_code == 403  # a public model runs on any hardware its submitter may use (not rival's)


def test_an_organizations_hardware_takes_jobs_only_from_its_members(api_client) -> None:
    """Any organization could queue public-model jobs on another's private hardware (a fuzzer queued 17)."""
    owner, other = OrganizationFactory(slug="owner"), OrganizationFactory(slug="other")
    private_hw, shared_hw = HardwareFactory(slug="owner-npu", organization=owner), HardwareFactory(slug="shared")
    public = ModelReleaseFactory(organization=other)
    outsider = make_token(organization=other, role=Role.ADMIN)
    before = Job.objects.count()
    response = api_client.post("/api/v1/jobs/", {"model": public.slug, "hardware": "owner-npu"}, format="json",
                               **auth(outsider))
    assert response.status_code == 403, response.content
    assert "owner-npu belongs to owner" in response.json()["detail"]
    assert Job.objects.count() == before
    member = make_token(organization=owner, role=Role.SUBMITTER)
    viewer = make_token(organization=owner, role=Role.VIEWER, scopes=["read"])
    assert api_client.post("/api/v1/jobs/", {"model": public.slug, "hardware": "owner-npu"}, format="json",
                           **auth(viewer)).status_code == 403
    for token, hardware in ((member, private_hw), (outsider, shared_hw), (member, shared_hw)):
        response = api_client.post("/api/v1/jobs/", {"model": public.slug, "hardware": hardware.slug},
                                   format="json", **auth(token))
        assert response.status_code == 201, (hardware.slug, response.content)
    # a user in both organizations acts, with a token, within the token's organization only
    both = UserFactory()
    Membership.objects.create(organization=owner, user=both, role=Role.SUBMITTER)
    Membership.objects.create(organization=other, user=both, role=Role.SUBMITTER)
    other_token = make_token(organization=other, user=both)
    assert api_client.post("/api/v1/jobs/", {"model": public.slug, "hardware": "owner-npu"}, format="json",
                           **auth(other_token)).status_code == 403
    staff = _session(UserFactory(is_staff=True))
    response = staff.post("/api/v1/jobs/", {"model": public.slug, "hardware": "owner-npu"},
                          content_type="application/json")
    assert response.status_code == 201, response.content


def test_an_agent_token_never_sees_another_organizations_embargoed_job(api_client, embargoed_model) -> None:
    rival = OrganizationFactory(slug="rival")
    hardware = HardwareFactory(slug="rival-npu", organization=rival)
    # a job placed before the dispatch rule existed: the hardware's agents must still not see it
    job = JobFactory(model=embargoed_model, hardware=hardware)
    agent = make_token(organization=rival, role=Role.ADMIN, scopes=["agent"], hardware=hardware)
    agent_id = api_client.post("/api/v1/agents/", {"hostname": "h1"}, format="json", **auth(agent)).json()["id"]
    for url in (f"/api/v1/jobs/{job.pk}/", f"/api/v1/jobs/{job.pk}/events/"):
        assert api_client.get(url, **auth(agent)).status_code == 404, url
    assert api_client.get("/api/v1/jobs/", **auth(agent)).json()["count"] == 0
    claim = api_client.post(f"/api/v1/jobs/{job.pk}/state/", {"state": "running", "agent": agent_id}, format="json",
                            **auth(agent))
    assert claim.status_code == 404
    result = api_client.post(f"/api/v1/jobs/{job.pk}/results/", {"stage": "serve", "section": {}}, format="json",
                             **auth(agent))
    assert result.status_code == 404
    beat = api_client.post(f"/api/v1/agents/{agent_id}/heartbeat/", {"current_job": job.pk}, format="json",
                           **auth(agent))
    assert beat.status_code == 400 and str(job.pk) in beat.json()["current_job"][0]
    own = JobFactory(model=ModelReleaseFactory(organization=rival, visibility="private",
                                               released_at=timezone.now() + timedelta(days=1)), hardware=hardware)
    assert api_client.get(f"/api/v1/jobs/{own.pk}/", **auth(agent)).status_code == 200  # its organization's own


def test_a_staff_operated_shared_hardwares_agent_token_sees_the_jobs_its_queue_carries(api_client,
                                                                                      embargoed_model) -> None:
    from apps.fleet.models import Agent
    from apps.jobs.models import Job

    ops = OrganizationFactory(slug="ops")
    shared = HardwareFactory(slug="shared-gpu")
    job = JobFactory(model=embargoed_model, hardware=shared)
    staff = _member(ops, Role.VIEWER, is_staff=True)
    secret = _mint(_session(staff), shared, ops).json()["token"]
    headers = {"HTTP_AUTHORIZATION": f"Token {secret}"}
    assert api_client.get(f"/api/v1/jobs/{job.pk}/", **headers).status_code == 200  # running: its queue's
    Job.objects.filter(pk=job.pk).update(state="succeeded")
    assert api_client.get(f"/api/v1/jobs/{job.pk}/", **headers).status_code == 404  # finished: not its history
    ran_it = Agent.objects.create(hardware=shared, hostname="gpu-host-1", token=ApiToken.objects.get(hardware=shared))
    Job.objects.filter(pk=job.pk).update(agent=ran_it)
    assert api_client.get(f"/api/v1/jobs/{job.pk}/", **headers).status_code == 200  # its own agent ran it
    staff.is_staff = False  # no longer staff: the token sees only what its organization may see
    staff.save(update_fields=["is_staff"])
    Job.objects.filter(pk=job.pk).update(state="running")
    assert api_client.get(f"/api/v1/jobs/{job.pk}/", **headers).status_code == 404
    # a token minted for shared hardware by a non-staff admin before the rule sees no embargoed job either
    legacy = make_token(organization=OrganizationFactory(), role=Role.ADMIN, scopes=["agent"], hardware=shared)
    assert api_client.get(f"/api/v1/jobs/{job.pk}/", **auth(legacy)).status_code == 404
