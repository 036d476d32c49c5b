"""Models and hardware through the API: computed fields, validation errors that name the field, 404s."""

from __future__ import annotations

import pytest

from apps.accounts.choices import Role
from apps.accounts.models import ApiToken
from apps.matrix.models import Cell
from tests.factories import HardwareFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token, tiny_config

pytestmark = pytest.mark.django_db


@pytest.fixture
def submitter() -> ApiToken:
    return make_token(organization=OrganizationFactory(slug="acme"), role=Role.SUBMITTER)


def test_creating_a_model_computes_its_fields_and_its_matrix_row(api_client, submitter) -> None:
    hardware = HardwareFactory()
    body = {"slug": "tiny-llama-1.1b", "name": "Tiny Llama", "config": tiny_config(),
            "released_at": "2025-03-01T00:00:00Z"}
    response = api_client.post("/api/v1/models/", body, format="json", **auth(submitter))
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["architecture"] == "LlamaForCausalLM" and data["family"] == "llama"
    assert data["params_total"] == data["params_active"] == 1_100_048_384  # TinyLlama-1.1B's exact count
    assert data["context_length"] == 2048 and data["organization"] == "acme"
    cell = Cell.objects.get(model__slug="tiny-llama-1.1b", hardware=hardware)
    assert cell.fits and cell.fits_devices == 1


def test_client_cannot_type_in_parameter_counts(api_client, submitter) -> None:
    body = {"slug": "m1", "name": "M1", "config": tiny_config(), "params_total": 5}
    data = api_client.post("/api/v1/models/", body, format="json", **auth(submitter)).json()
    assert data["params_total"] == 1_100_048_384


def test_a_config_missing_a_required_key_is_a_400_naming_the_key(api_client, submitter) -> None:
    config = tiny_config()
    del config["hidden_size"]
    response = api_client.post("/api/v1/models/", {"slug": "m2", "name": "M2", "config": config}, format="json",
                               **auth(submitter))
    assert response.status_code == 400
    assert "hidden_size" in response.json()["config"][0]


def test_a_config_that_is_not_an_object_is_a_400(api_client, submitter) -> None:
    response = api_client.post("/api/v1/models/", {"slug": "m3", "name": "M3", "config": [1, 2]}, format="json",
                               **auth(submitter))
    assert response.status_code == 400 and "config" in response.json()


def test_malformed_json_is_a_400(api_client, submitter) -> None:
    response = api_client.generic("POST", "/api/v1/models/", '{"slug": "x", "config": {', content_type="application/json",
                                  **auth(submitter))
    assert response.status_code == 400
    assert "JSON parse error" in response.json()["detail"]


def test_a_duplicate_slug_is_a_409_naming_its_owner(api_client, submitter) -> None:
    ModelReleaseFactory(slug="dup-1b", organization=OrganizationFactory(slug="first-org"))
    response = api_client.post("/api/v1/models/", {"slug": "dup-1b", "name": "D", "config": tiny_config()},
                               format="json", **auth(submitter))
    assert response.status_code == 409 and "belongs to organization first-org" in response.json()["detail"]
    response = api_client.post("/api/v1/hardware/", {"slug": HardwareFactory().slug}, format="json",
                               **auth(make_token(organization=OrganizationFactory(), role=Role.ADMIN)))
    assert response.status_code == 409 and "the shared catalog" in response.json()["detail"]


def test_unknown_slugs_are_404_with_a_message(api_client) -> None:
    for url in ("/api/v1/models/nope/", "/api/v1/hardware/nope/", "/api/v1/cells/nope/nada/", "/api/v1/jobs/999999/"):
        response = api_client.get(url)
        assert response.status_code == 404, url
        assert "nope" in response.json()["detail"] or "999999" in response.json()["detail"]


def test_updating_a_config_recomputes_counts_and_fits(api_client, submitter) -> None:
    hardware = HardwareFactory(memory_bytes=4 * 10**9, devices_per_node=1)
    model = ModelReleaseFactory(organization=submitter.organization)
    before = Cell.objects.get(model=model, hardware=hardware)
    assert before.fits is True and before.fits_devices == 1
    bigger = tiny_config(num_hidden_layers=120)
    response = api_client.patch(f"/api/v1/models/{model.slug}/", {"config": bigger}, format="json",
                                **auth(submitter))
    assert response.status_code == 200, response.content
    assert response.json()["params_total"] > 5 * 10**9
    after = Cell.objects.get(model=model, hardware=hardware)
    assert after.fits_devices >= 4  # ~11.7 GB of bf16 weights over 4 GB devices


def test_anonymous_and_viewers_cannot_create(api_client) -> None:
    body = {"slug": "m4", "name": "M4", "config": tiny_config()}
    assert api_client.post("/api/v1/models/", body, format="json").status_code == 401
    viewer = make_token(organization=OrganizationFactory(), role=Role.VIEWER, scopes=["read"])
    assert api_client.post("/api/v1/models/", body, format="json", **auth(viewer)).status_code == 403


def test_hardware_needs_an_admin_and_valid_values(api_client, submitter) -> None:
    body = {"slug": "npu-9", "vendor": "Acme", "name": "NPU 9", "memory_bytes": 64 * 2**30, "devices_per_node": 8,
            "dtypes": ["bfloat16"], "peak_tflops": {"bfloat16": 400}}
    assert api_client.post("/api/v1/hardware/", body, format="json", **auth(submitter)).status_code == 403
    admin = make_token(organization=OrganizationFactory(), role=Role.ADMIN)
    bad = dict(body, memory_bytes=0, dtypes=["bfloat17"])
    response = api_client.post("/api/v1/hardware/", bad, format="json", **auth(admin))
    assert response.status_code == 400
    assert set(response.json()) == {"memory_bytes", "dtypes"}
    model = ModelReleaseFactory()
    response = api_client.post("/api/v1/hardware/", body, format="json", **auth(admin))
    assert response.status_code == 201
    assert Cell.objects.get(model=model, hardware__slug="npu-9").fits is True


def test_lists_filter_order_and_paginate(api_client) -> None:
    for i in range(3):
        ModelReleaseFactory(slug=f"list-{i}", config=tiny_config(num_hidden_layers=10 + i))
    ModelReleaseFactory(slug="moe-x", config=tiny_config(architectures=["Qwen3ForCausalLM"], model_type="qwen3",
                                                          head_dim=64))
    data = api_client.get("/api/v1/models/?family=llama&ordering=-params_total&page_size=2").json()
    assert data["count"] == 3 and len(data["results"]) == 2
    assert [r["slug"] for r in data["results"]] == ["list-2", "list-1"]
    assert "config" not in data["results"][0]
    assert api_client.get("/api/v1/models/?family=qwen3").json()["results"][0]["slug"] == "moe-x"
    HardwareFactory(vendor="Zeta")
    assert api_client.get("/api/v1/hardware/?vendor=Zeta").json()["count"] == 1
