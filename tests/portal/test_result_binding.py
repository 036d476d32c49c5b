"""Results are bound to (job, attempt, nonce) and a job succeeds only with a verdict for every stage it asked
for: through the REST API with a real agent token."""

from __future__ import annotations

from typing import Any

import pytest

from apps.evidence.models import StageResult
from apps.jobs.choices import JobState
from apps.jobs.models import Job
from apps.matrix.models import Cell
from tests.factories import HardwareFactory, JobFactory, OrganizationFactory, auth, make_token
from tests.portal.reports import bound, new_attempt, passing

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent_job() -> tuple:
    hardware = HardwareFactory()
    job = JobFactory(hardware=hardware, spec={"stages": ["plan", "load", "serve"], "dtype": "bfloat16"})
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    return job, token


def _post(api_client: Any, job: Job, token: Any, doc: dict[str, Any]) -> Any:
    return api_client.post(f"/api/v1/jobs/{job.pk}/results/", doc, format="json", **auth(token))


def _without(doc: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != key}


PLAN = {"stage": "plan", "section": passing("plan")}
REPORT = {"stages": {"plan": passing("plan")}}

# (case, how the document is made from the properly bound one, status, the field or words the answer names)
REFUSED = [
    ("no attempt", lambda job, doc: _without(bound(job, doc), "attempt"), 400, "attempt"),
    ("no nonce", lambda job, doc: _without(bound(job, doc), "nonce"), 400, "nonce"),
    ("attempt not a number", lambda job, doc: {**bound(job, doc), "attempt": "1"}, 400, "attempt"),
    ("a nonce too long", lambda job, doc: {**bound(job, doc), "nonce": "n" * 65}, 400, "nonce"),
    ("a wrong nonce", lambda job, doc: {**bound(job, doc), "nonce": "0" * 32}, 409, "the nonce does not match"),
    ("a non-ASCII nonce", lambda job, doc: {**bound(job, doc), "nonce": "é" * 32}, 409, "the nonce does not match"),
    ("a future attempt", lambda job, doc: {**bound(job, doc), "attempt": 2}, 409, "is at attempt 1"),
]


@pytest.mark.parametrize("form", [PLAN, REPORT], ids=["section", "report"])
@pytest.mark.parametrize(("case", "make", "status", "named"), REFUSED, ids=[r[0] for r in REFUSED])
def test_an_unbound_result_is_refused_naming_why_and_stores_nothing(api_client, agent_job, form, case, make, status,
                                                                    named) -> None:
    job, token = agent_job
    response = _post(api_client, job, token, make(job, form))
    assert response.status_code == status, response.content
    body = response.json()
    assert (named in body) if status == 400 else (named in body["detail"]), body
    assert not StageResult.objects.exists() and Cell.objects.get(model=job.model, hardware=job.hardware).tier == 0


@pytest.mark.parametrize("form", [PLAN, REPORT], ids=["section", "report"])
def test_a_replayed_section_is_a_409_and_the_stored_one_stays(api_client, agent_job, form) -> None:
    job, token = agent_job
    assert _post(api_client, job, token, bound(job, form)).status_code == 201
    stored = StageResult.objects.get(job=job, stage="plan")
    for doc in (bound(job, form), bound(job, {"stage": "plan", "section": {**passing("plan"), "fits": False}})):
        again = _post(api_client, job, token, doc)
        assert again.status_code == 409 and "already has a result for plan" in again.json()["detail"]
    assert StageResult.objects.get(job=job, stage="plan") == stored and stored.attempt == 1


def test_a_section_of_a_superseded_attempt_is_a_409(api_client, agent_job) -> None:
    job, token = agent_job
    old = bound(job, {"stage": "load", "section": passing("load")})
    new_attempt(job)  # lost and sent out again: attempt 2 with a fresh nonce
    late = _post(api_client, job, token, old)
    assert late.status_code == 409 and "attempt 1" in late.json()["detail"] and "superseded" in late.json()["detail"]
    assert _post(api_client, job, token, bound(job, PLAN)).status_code == 201
    assert list(StageResult.objects.filter(job=job).values_list("stage", "attempt")) == [("plan", 2)]


@pytest.mark.parametrize(("posted", "state", "failed_stage", "error"), [
    ([], "failed", "plan", "no result for stages: plan, load, serve"),
    (["plan"], "failed", "load", "no result for stages: load, serve"),
    (["plan", "serve"], "failed", "load", "no result for stages: load"),
    (["plan", "load", "serve"], "succeeded", "", ""),
])
def test_a_job_succeeds_only_with_a_verdict_for_every_requested_stage(api_client, agent_job, posted, state,
                                                                      failed_stage, error) -> None:
    job, token = agent_job
    for stage in posted:
        assert _post(api_client, job, token, bound(job, {"stage": stage, "section": passing(stage)})).status_code == 201
    done = api_client.post(f"/api/v1/jobs/{job.pk}/state/", {"state": "succeeded"}, format="json", **auth(token))
    assert done.status_code == 200, done.content
    assert (done.json()["state"], done.json()["failed_stage"], done.json()["error"]) == (state, failed_stage, error)
    cell = Cell.objects.get(model=job.model, hardware=job.hardware)
    assert cell.failed_stage == failed_stage and (not error or error in cell.error)


def test_results_of_an_earlier_attempt_do_not_make_a_later_one_succeed(api_client, agent_job) -> None:
    job, token = agent_job
    for stage in ("plan", "load", "serve"):
        _post(api_client, job, token, bound(job, {"stage": stage, "section": passing(stage)}))
    new_attempt(job)
    _post(api_client, job, token, bound(job, PLAN))
    done = api_client.post(f"/api/v1/jobs/{job.pk}/state/", {"state": "succeeded"}, format="json", **auth(token))
    assert done.json()["state"] == JobState.FAILED and done.json()["error"] == "no result for stages: load, serve"
