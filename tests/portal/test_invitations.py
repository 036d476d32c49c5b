"""Membership by invitation: an admin invites, the invitee accepts or declines; nobody joins without consent."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.accounts.choices import Role
from apps.accounts.models import Invitation, Membership
from tests.factories import OrganizationFactory, UserFactory, auth, make_token

pytestmark = pytest.mark.django_db


def _session(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def org_admin() -> tuple:
    org = OrganizationFactory(slug="lab")
    admin = UserFactory(username="boss")
    Membership.objects.create(organization=org, user=admin, role=Role.ADMIN)
    return org, admin, _session(admin)


def test_an_invitee_joins_only_by_accepting(org_admin) -> None:
    org, _, admin = org_admin
    invitee = UserFactory(username="ada")
    response = admin.post("/api/v1/organizations/lab/invitations/", {"username": "ada", "role": "submitter"},
                          content_type="application/json")
    assert response.status_code == 201, response.content
    invitation = response.json()
    assert invitation["state"] == "pending" and invitation["invited_by"] == "boss" and invitation["role"] == "submitter"
    assert not Membership.objects.filter(user=invitee).exists()
    ada = _session(invitee)
    mine = ada.get("/api/v1/invitations/").json()
    assert [i["id"] for i in mine["results"]] == [invitation["id"]] and mine["results"][0]["organization"] == "lab"
    response = ada.post(f"/api/v1/invitations/{invitation['id']}/accept/")
    assert response.status_code == 200 and response.json()["state"] == "accepted"
    assert Membership.objects.get(organization=org, user=invitee).role == Role.SUBMITTER
    assert ada.post(f"/api/v1/invitations/{invitation['id']}/accept/").status_code == 409  # answered once
    members = admin.get("/api/v1/organizations/lab/members/").json()["results"]
    assert {m["username"] for m in members} == {"boss", "ada"}


def test_a_declined_invitation_changes_nothing_and_others_cannot_answer(org_admin) -> None:
    org, _, admin = org_admin
    invitee, stranger = UserFactory(username="bob"), UserFactory(username="eve")
    invitation = admin.post("/api/v1/organizations/lab/invitations/", {"username": "bob"},
                            content_type="application/json").json()
    assert invitation["role"] == "viewer"
    eve = _session(stranger)
    assert eve.post(f"/api/v1/invitations/{invitation['id']}/accept/").status_code == 404  # not hers to see
    assert admin.post(f"/api/v1/invitations/{invitation['id']}/accept/").status_code == 403  # only the invitee
    bob = _session(invitee)
    response = bob.post(f"/api/v1/invitations/{invitation['id']}/decline/")
    assert response.status_code == 200 and response.json()["state"] == "declined"
    assert not Membership.objects.filter(user=invitee).exists()
    assert bob.post(f"/api/v1/invitations/{invitation['id']}/accept/").status_code == 409


def test_only_admins_invite_and_an_admin_revokes_a_pending_invitation(org_admin, api_client) -> None:
    org, _, admin = org_admin
    UserFactory(username="carol")
    submitter = make_token(organization=org, role=Role.SUBMITTER)
    response = api_client.post("/api/v1/organizations/lab/invitations/", {"username": "carol"}, format="json",
                               **auth(submitter))
    assert response.status_code == 403
    read_admin = make_token(organization=org, user=org.memberships.get(role=Role.ADMIN).user, scopes=["read"])
    assert api_client.post("/api/v1/organizations/lab/invitations/", {"username": "carol"}, format="json",
                           **auth(read_admin)).status_code == 403
    assert admin.post("/api/v1/organizations/lab/invitations/", {"username": "ghost"},
                      content_type="application/json").status_code == 400
    assert admin.post("/api/v1/organizations/lab/invitations/", {"username": "boss"},
                      content_type="application/json").status_code == 400  # already a member
    first = admin.post("/api/v1/organizations/lab/invitations/", {"username": "carol"},
                       content_type="application/json").json()
    again = admin.post("/api/v1/organizations/lab/invitations/", {"username": "carol", "role": "admin"},
                       content_type="application/json").json()
    assert again["id"] == first["id"] and again["role"] == "admin"  # one pending invitation, updated
    listed = admin.get("/api/v1/organizations/lab/invitations/").json()
    assert listed["count"] == 1
    assert api_client.get("/api/v1/organizations/lab/invitations/", **auth(submitter)).status_code == 403
    response = admin.post(f"/api/v1/invitations/{first['id']}/decline/")
    assert response.status_code == 200 and response.json()["state"] == "revoked"
    assert Invitation.objects.get(pk=first["id"]).state == "revoked"
