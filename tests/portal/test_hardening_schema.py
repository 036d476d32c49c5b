"""The OpenAPI schema says what the API answers."""

from __future__ import annotations

import pytest

from apps.accounts.choices import Role
from tests.factories import OrganizationFactory, auth, make_token

pytestmark = pytest.mark.django_db


def test_nullable_fields_are_nullable_in_the_schema(api_client) -> None:
    schemas = api_client.get("/api/schema/?format=json").json()["components"]["schemas"]
    assert schemas["ApiToken"]["properties"]["hardware"].get("nullable") is True
    assert schemas["Job"]["properties"]["requested_by"].get("nullable") is True
    org = OrganizationFactory()
    listed = api_client.get("/api/v1/tokens/", **auth(make_token(organization=org))).json()["results"]
    assert listed[0]["hardware"] is None  # what the schema now allows


def test_members_answer_the_paginated_list_the_schema_describes(api_client) -> None:
    schema = api_client.get("/api/schema/?format=json").json()
    for method in ("get", "post"):
        operation = schema["paths"]["/api/v1/organizations/{slug}/members/"][method]
        ref = operation["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[-1]
        assert {"count", "next", "previous", "results"} <= set(schema["components"]["schemas"][ref]["properties"])
    org = OrganizationFactory(slug="lab")
    token = make_token(organization=org, role=Role.ADMIN)
    body = api_client.get("/api/v1/organizations/lab/members/?page_size=1", **auth(token)).json()
    assert body["count"] == 1 and len(body["results"]) == 1 and body["results"][0]["role"] == "admin"
    body = api_client.post("/api/v1/organizations/lab/members/", {"username": token.user.username, "role": "admin"},
                           format="json", **auth(token)).json()
    assert body["count"] == 1 and body["results"][0]["username"] == token.user.username
