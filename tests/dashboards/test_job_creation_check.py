"""The REST API and the cell page's run form create jobs through one check (``jobs.services.check_create_job``):
the same bad input is refused by both with the same message, and a job that names no dtype gets the same one."""

from __future__ import annotations

import html
from typing import Any

import pytest

from apps.accounts.choices import Role
from apps.accounts.models import Membership
from apps.jobs.models import Job
from tests.factories import (
    HardwareFactory,
    ModelReleaseFactory,
    OrganizationFactory,
    UserFactory,
    auth,
    make_token,
    tiny_config,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def submitter() -> Any:
    org = OrganizationFactory()
    user = UserFactory()
    Membership.objects.create(organization=org, user=user, role=Role.SUBMITTER)
    user.token = make_token(organization=org, user=user)
    return user


def _form_data(body: dict[str, Any]) -> dict[str, Any]:
    """The run form's fields for an API body (stages, dtype, the plan overrides and threshold overrides)."""
    data: dict[str, Any] = {"stages": body["stages"], "preset": "default"}
    for key in ("dtype", "tp", "pp", "ep"):
        if key in body:
            data[key] = str(body[key])
    if "thresholds" in body:
        data["thresholds"] = ",".join(f"{k}={v}" for k, v in body["thresholds"].items())
    return data


@pytest.mark.parametrize(("bad", "field", "says"), [
    ({"thresholds": {"kv_cache_max_len": 100_000}}, "thresholds", "context length"),
    ({"tp": 3}, "tp", "must divide the 32 attention heads"),
    ({"tp": 4, "pp": 2}, "pp", "spans nodes"),
    ({"dtype": "float8_e4m3fn"}, "dtype", "does not support float8_e4m3fn"),
])
def test_the_api_and_the_form_refuse_the_same_input_with_the_same_message(api_client, client, submitter, bad, field,
                                                                           says) -> None:
    model = ModelReleaseFactory(organization=submitter.token.organization, config=tiny_config(max_position_embeddings=4096))
    hardware = HardwareFactory(dtypes=["float32", "bfloat16"])
    body = {"model": model.slug, "hardware": hardware.slug, "stages": ["plan", "load"], **bad}

    api = api_client.post("/api/v1/jobs/", body, format="json", **auth(submitter.token))
    assert api.status_code == 400, api.content
    (message,) = api.json()[field]
    assert says in message

    client.force_login(submitter)
    page = client.post(f"/cells/{model.slug}/{hardware.slug}/run/", _form_data(body))
    assert page.status_code == 400, page.content[:300]
    text = html.unescape(page.content.decode())
    assert "The job was not created" in text and message in text  # the API's own sentence, next to the field
    assert Job.objects.count() == 0


def test_a_job_naming_no_dtype_gets_the_same_one_from_the_api_and_the_form(api_client, client, submitter) -> None:
    model = ModelReleaseFactory(organization=submitter.token.organization)
    hardware = HardwareFactory(dtypes=["float16", "float32"])  # no bfloat16: float32, not the first listed
    api = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug, "stages": ["plan"]},
                          format="json", **auth(submitter.token))
    assert api.status_code == 201, api.content
    assert api.json()["spec"]["dtype"] == "float32"

    client.force_login(submitter)
    cell = client.get(f"/cells/{model.slug}/{hardware.slug}/").content.decode()
    assert "<option selected>float32</option>" in cell  # the form starts at the API's default
    page = client.post(f"/cells/{model.slug}/{hardware.slug}/run/", {"stages": ["plan"], "preset": "default"})
    assert page.status_code == 302, page.content[:300]
    assert Job.objects.latest("id").spec["dtype"] == "float32"
