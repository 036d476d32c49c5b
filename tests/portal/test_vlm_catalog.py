"""A vision-language release in the catalog: its config's vision tower makes it a release that takes images
(unless modalities are given), and its parameter count includes the tower and projector."""

from __future__ import annotations

import json

import pytest

from agents.runtime.testing.make_model import cached_model
from apps.accounts.choices import Role
from contract.model.vision_params import count_vision_params
from tests.factories import OrganizationFactory, auth, make_token

pytestmark = pytest.mark.django_db


def test_a_release_with_a_vision_tower_takes_images(api_client) -> None:
    token = make_token(organization=OrganizationFactory(slug="acme"), role=Role.SUBMITTER)
    config = json.loads((cached_model("llava") / "config.json").read_text())
    body = {"slug": "tiny-llava", "name": "Tiny LLaVA", "config": config, "released_at": "2026-01-01T00:00:00Z"}
    response = api_client.post("/api/v1/models/", body, format="json", **auth(token))
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["modalities"] == ["text", "image"]
    assert data["architecture"] == "LlavaForConditionalGeneration"
    text_only = {**config["text_config"], "architectures": ["LlamaForCausalLM"]}
    text = api_client.post("/api/v1/models/", {**body, "slug": "tiny-llama-text", "config": text_only},
                           format="json", **auth(token)).json()
    assert data["params_total"] - text["params_total"] == count_vision_params(config) > 0
    assert text["modalities"] == []
    given = api_client.post("/api/v1/models/", {**body, "slug": "tiny-llava-2", "modalities": ["text"]},
                            format="json", **auth(token)).json()
    assert given["modalities"] == ["text"]  # what the submitter says wins
