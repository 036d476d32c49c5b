"""API tokens: hashed at rest, shown once, scoped, revocable, with a last-used time."""

from __future__ import annotations

import hashlib

import pytest
from django.test import Client

from apps.accounts.choices import Role
from apps.accounts.models import ApiToken, Membership
from tests.factories import HardwareFactory, OrganizationFactory, UserFactory, auth, make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client(client: Client) -> tuple:
    org = OrganizationFactory(slug="vendor")
    user = UserFactory()
    Membership.objects.create(organization=org, user=user, role=Role.ADMIN)
    client.force_login(user)
    return client, org, user


def test_a_token_is_shown_once_and_stored_hashed(admin_client) -> None:
    client, org, _ = admin_client
    response = client.post("/api/v1/tokens/", {"name": "ci", "scopes": ["submit"]}, content_type="application/json")
    assert response.status_code == 201, response.content
    secret = response.json()["token"]
    row = ApiToken.objects.get(pk=response.json()["id"])
    assert row.key_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert secret not in str(ApiToken.objects.filter(pk=row.pk).values().first())
    assert secret.startswith(row.prefix) and sorted(row.scopes) == ["read", "submit"]
    listed = client.get("/api/v1/tokens/").json()["results"]
    assert listed[0]["prefix"] == row.prefix and "token" not in listed[0]


def test_bearer_and_token_headers_authenticate_and_record_last_use(api_client) -> None:
    token = make_token(organization=OrganizationFactory())
    assert token.last_used_at is None
    assert api_client.get("/api/v1/tokens/", HTTP_AUTHORIZATION=f"Bearer {token.secret}").status_code == 200
    assert api_client.get("/api/v1/tokens/", **auth(token)).status_code == 200
    token.refresh_from_db()
    assert token.last_used_at is not None


def test_a_revoked_or_unknown_token_is_refused(api_client) -> None:
    token = make_token(organization=OrganizationFactory())
    response = api_client.post(f"/api/v1/tokens/{token.pk}/revoke/", **auth(token))
    assert response.status_code == 200 and response.json()["revoked_at"]
    assert api_client.get("/api/v1/models/", **auth(token)).status_code == 401
    assert api_client.get("/api/v1/models/", HTTP_AUTHORIZATION="Token d0_wrong").status_code == 401


def test_scopes_are_limited_by_role_and_agent_tokens_need_a_hardware(admin_client) -> None:
    client, org, user = admin_client
    response = client.post("/api/v1/tokens/", {"name": "a", "scopes": ["agent"]}, content_type="application/json")
    assert response.status_code == 400 and "hardware" in response.json()
    hw = HardwareFactory(organization=org)
    response = client.post("/api/v1/tokens/", {"name": "a", "scopes": ["agent"], "hardware": hw.slug},
                           content_type="application/json")
    assert response.status_code == 201 and response.json()["hardware"] == hw.slug
    Membership.objects.filter(user=user).update(role=Role.SUBMITTER)
    response = client.post("/api/v1/tokens/", {"name": "a", "scopes": ["agent"], "hardware": hw.slug},
                           content_type="application/json")
    assert response.status_code == 403
    response = client.post("/api/v1/tokens/", {"name": "a", "scopes": ["root"]}, content_type="application/json")
    assert response.status_code == 400 and "scopes" in response.json()


def test_tokens_cannot_mint_tokens(api_client) -> None:
    token = make_token(organization=OrganizationFactory(), role=Role.ADMIN)
    response = api_client.post("/api/v1/tokens/", {"name": "x", "scopes": ["read"]}, format="json", **auth(token))
    assert response.status_code == 403


def test_session_writes_need_csrf(admin_client) -> None:
    from django.test import Client

    _, _, user = admin_client
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(user)
    response = strict.post("/api/v1/tokens/", {"name": "x", "scopes": ["read"]}, content_type="application/json")
    assert response.status_code == 403 and "CSRF" in response.json()["detail"]


def test_admins_manage_members_and_keep_one_admin(admin_client, api_client) -> None:
    client, org, user = admin_client
    newcomer = UserFactory(username="newcomer")
    url = f"/api/v1/organizations/{org.slug}/members/"
    # no one is added without consent: naming a non-member is a 400 that points to invitations
    response = client.post(url, {"username": "newcomer", "role": "submitter"}, content_type="application/json")
    assert response.status_code == 400 and "invitations/" in response.json()["username"][0]
    assert not Membership.objects.filter(user=newcomer).exists()
    Membership.objects.create(organization=org, user=newcomer, role=Role.VIEWER)
    response = client.post(url, {"username": "newcomer", "role": "submitter"}, content_type="application/json")
    assert response.status_code == 200
    assert {m["username"]: m["role"] for m in response.json()["results"]} == {user.username: "admin",
                                                                              "newcomer": "submitter"}
    assert client.post(url, {"username": user.username, "role": "viewer"},
                       content_type="application/json").status_code == 400  # the last admin
    assert client.post(url, {"username": "ghost", "role": "viewer"}, content_type="application/json").status_code == 400
    member_token = make_token(organization=org, user=newcomer)
    listed = api_client.get(url, **auth(member_token))
    assert listed.status_code == 200
    assert listed.json()["count"] == 2 and [m["username"] for m in listed.json()["results"]] == sorted(
        [user.username, "newcomer"])  # paginated, as the schema says
    assert api_client.post(url, {"username": "newcomer", "role": "admin"}, format="json",
                           **auth(member_token)).status_code == 403
    outsider = make_token(organization=OrganizationFactory(), role=Role.ADMIN)
    assert api_client.get(url, **auth(outsider)).status_code == 403
    response = client.post(url, {"username": "newcomer", "role": None}, content_type="application/json")
    assert [m["username"] for m in response.json()["results"]] == [user.username]


def test_create_token_command_prints_a_working_agent_token(api_client) -> None:
    from io import StringIO

    from django.core.management import CommandError, call_command

    org = OrganizationFactory(slug="ops")
    user = UserFactory(username="operator")
    Membership.objects.create(organization=org, user=user, role=Role.ADMIN)
    hardware = HardwareFactory(organization=org)
    out = StringIO()
    call_command("create_token", "--user", "operator", "--org", "ops", "--scopes", "agent",
                 "--hardware", hardware.slug, stdout=out, stderr=StringIO())
    secret = out.getvalue().strip()
    response = api_client.post("/api/v1/agents/", {"hostname": "h1"}, format="json",
                               HTTP_AUTHORIZATION=f"Token {secret}")
    assert response.status_code == 201
    with pytest.raises(CommandError, match="bound to a hardware"):
        call_command("create_token", "--user", "operator", "--org", "ops", "--scopes", "agent",
                     stdout=StringIO(), stderr=StringIO())


def test_read_and_agent_tokens_cannot_revoke_tokens_even_an_admins(api_client) -> None:
    org = OrganizationFactory()
    admin = UserFactory()
    Membership.objects.create(organization=org, user=admin, role=Role.ADMIN)
    victim = make_token(organization=org, user=admin, name="ci")
    read = make_token(organization=org, user=admin, scopes=["read"], name="read")
    agent = make_token(organization=org, user=admin, scopes=["agent"], hardware=HardwareFactory(organization=org),
                       name="agent")
    for token in (read, agent):
        response = api_client.post(f"/api/v1/tokens/{victim.pk}/revoke/", **auth(token))
        assert response.status_code == 403, response.content
        assert "submit scope" in response.json()["detail"]
        response = api_client.post(f"/api/v1/tokens/{token.pk}/revoke/", **auth(token))  # not even itself
        assert response.status_code == 403
    victim.refresh_from_db()
    assert victim.revoked_at is None
    submit = make_token(organization=org, user=admin, name="submit")  # a submit token of the admin may
    assert api_client.post(f"/api/v1/tokens/{victim.pk}/revoke/", **auth(submit)).status_code == 200
