"""A vendor's agent posting stage reports into a cell of its own, for the forgery tests: the cell, a post of one
results document bound to its job's attempt and nonce, and a climb through honest sections to a tier."""

from __future__ import annotations

from typing import Any

from tests.factories import HardwareFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token
from tests.portal.challenges import answer
from tests.portal.reports import TIER_STAGES, bound, passing


def agent_cell() -> tuple:
    """(a model, a hardware, an agent token of another organization bound to that hardware)."""
    hardware = HardwareFactory()
    model = ModelReleaseFactory()
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    return model, hardware, token


def post_result(api_client: Any, job: Any, token: Any, doc: dict[str, Any]) -> Any:
    return api_client.post(f"/api/v1/jobs/{job.pk}/results/", bound(job, doc), format="json", **auth(token))


def climb_to(api_client: Any, job: Any, token: Any, tier: int) -> None:
    """Posts honest passing sections of every stage up to ``tier`` (none for tier 0)."""
    for stage in TIER_STAGES[tier] if tier else []:
        response = post_result(api_client, job, token,
                               {"stage": stage, "section": answer(job, stage, passing(stage))})
        assert response.status_code == 201 and response.json()["stored"][0]["verdict"] == "pass", response.content
