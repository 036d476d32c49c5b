"""An external engine's align through the REST API: endpoint align (e2e answered through the engine's endpoint
and scored by the portal against its reference, plus the KV self-consistency check) takes its cell to tier 4;
the same section without the e2e raw outputs, or the bundled runtime's form of align, gains nothing."""

from __future__ import annotations

from typing import Any

import pytest

from tests.endpoint_sections import endpoint_align
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token
from tests.portal.challenges import answer
from tests.portal.reports import TIER_STAGES, bound, passing

pytestmark = pytest.mark.django_db

VLLM = {"name": "vllm", "version": "0.32.0", "executable": "vllm",
        "command": "vllm serve {model_path} --port {port} --dtype {dtype}"}


@pytest.fixture
def external_job() -> tuple:
    hardware = HardwareFactory()
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    job = JobFactory(model=ModelReleaseFactory(), hardware=hardware,
                     spec={"stages": ["plan", "load", "inventory", "align", "serve", "bench", "env", "eval"],
                           "dtype": "float32", "engine": VLLM})
    return job, token


def _post(api_client: Any, job: Any, token: Any, stage: str, section: dict[str, Any]) -> dict[str, Any]:
    response = api_client.post(f"/api/v1/jobs/{job.pk}/results/", bound(job, {"stage": stage, "section": section}),
                               format="json", **auth(token))
    assert response.status_code == 201, response.content
    return response.json()


def _serves(api_client: Any, job: Any, token: Any) -> None:
    for stage in TIER_STAGES[3]:
        body = _post(api_client, job, token, stage, answer(job, stage, passing(stage)))
        assert body["stored"][0]["verdict"] == "pass", body


def test_endpoint_align_with_portal_scored_e2e_takes_an_external_engine_to_aligned(api_client, external_job):
    job, token = external_job
    _serves(api_client, job, token)
    body = _post(api_client, job, token, "align", answer(job, "align", endpoint_align()))
    stored = body["stored"][0]
    assert stored["verdict"] == "pass", stored["reasons"]
    assert body["cell"]["tier"] == 4
    page = api_client.get(f"/cells/{job.model.slug}/{job.hardware.slug}/?engine=vllm@0.32.0")  # the cell says what replaced align
    assert page.status_code == 200 and 'id="endpoint-align"' in page.content.decode()
    assert "engine <code>vllm</code>" in page.content.decode()


@pytest.mark.parametrize(("section", "reason"), [
    (endpoint_align(), "e2e: raw outputs missing"),  # no answers to the challenge
    (passing("align"), "an external engine (vllm) is aligned through its endpoint"),
    (endpoint_align(hit=1.5), "kv_self hit: mean top-k KL"),
])
def test_an_external_engines_align_without_its_evidence_gains_nothing(api_client, external_job, section, reason):
    job, token = external_job
    _serves(api_client, job, token)
    if reason.startswith("kv_self"):
        section = answer(job, "align", section)
    body = _post(api_client, job, token, "align", section)
    stored = body["stored"][0]
    assert stored["verdict"] in {"incomplete", "fail"} and any(reason in r for r in stored["reasons"]), stored
    assert body["cell"]["tier"] == 3
