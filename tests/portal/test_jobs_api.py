"""Jobs: submit (stored queued, dispatched after commit), list, cancel, and the state machine."""

from __future__ import annotations

import pytest

from apps.accounts.choices import Role
from apps.jobs import services
from apps.jobs.choices import ALLOWED_TRANSITIONS, JobState
from apps.jobs.models import Job
from apps.jobs.services import InvalidTransition, do_transition_job
from apps.matrix.models import Cell
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token

pytestmark = pytest.mark.django_db


@pytest.fixture
def setup() -> tuple:
    org = OrganizationFactory()
    return ModelReleaseFactory(organization=org), HardwareFactory(), make_token(organization=org)


def test_creating_a_job_stores_it_queued_and_enqueues_after_commit(api_client, setup, monkeypatch,
                                                                   django_capture_on_commit_callbacks) -> None:
    model, hardware, token = setup
    sent: list[int] = []
    monkeypatch.setattr(services, "do_dispatch_job", sent.append)
    body = {"model": model.slug, "hardware": hardware.slug, "stages": ["load", "plan"], "tp": 2,
            "bench": {"concurrency": [1, 8]}}
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = api_client.post("/api/v1/jobs/", body, format="json", **auth(token))
        assert sent == []  # nothing leaves before the transaction commits
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["state"] == "queued" and data["attempts"] == 0
    assert data["spec"]["stages"] == ["plan", "load"] and data["spec"]["tp"] == 2
    assert data["spec"]["dtype"] == "bfloat16"
    for callback in callbacks:
        callback()
    assert sent == [data["id"]]
    assert Cell.objects.get(model=model, hardware=hardware).job_count == 1


@pytest.mark.parametrize(("body", "field"), [
    ({"stages": ["plan", "dance"]}, "stages"),
    ({"stages": []}, "stages"),
    ({"dtype": "float128"}, "dtype"),
    ({"dtype": "float8_e4m3fn"}, "dtype"),  # the factory's hardware does not list fp8
    ({"tp": 0}, "tp"),
    ({"thresholds": {"layer_cosnie": 0.9}}, "thresholds"),  # a misspelt override is refused, not ignored
    ({"bench": {"concurrency": [0]}}, "bench"),
    ({"model": "no-such-model"}, "model"),
    ({"hardware": "no-such-hw"}, "hardware"),
])
def test_bad_job_requests_are_400_naming_the_field(api_client, setup, body, field) -> None:
    model, hardware, token = setup
    request = {"model": model.slug, "hardware": hardware.slug, **body}
    response = api_client.post("/api/v1/jobs/", request, format="json", **auth(token))
    assert response.status_code == 400 and field in response.json(), response.content
    assert Job.objects.count() == 0


def test_cancel_moves_an_active_job_to_cancelled_once(api_client, setup) -> None:
    model, hardware, token = setup
    job_id = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug}, format="json",
                             **auth(token)).json()["id"]
    response = api_client.post(f"/api/v1/jobs/{job_id}/cancel/", **auth(token))
    assert response.status_code == 200 and response.json()["state"] == "cancelled"
    again = api_client.post(f"/api/v1/jobs/{job_id}/cancel/", **auth(token))
    assert again.status_code == 409 and "cancelled" in again.json()["detail"]
    assert api_client.post(f"/api/v1/jobs/{job_id}/cancel/").status_code == 401


def test_others_cannot_cancel(api_client, setup) -> None:
    model, hardware, token = setup
    job_id = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug}, format="json",
                             **auth(token)).json()["id"]
    stranger = make_token(organization=OrganizationFactory(), role=Role.SUBMITTER)
    assert api_client.post(f"/api/v1/jobs/{job_id}/cancel/", **auth(stranger)).status_code == 403


def test_list_filters_by_state_model_and_hardware(api_client, setup) -> None:
    model, hardware, _ = setup
    JobFactory(model=model, hardware=hardware, state=JobState.QUEUED)
    JobFactory(model=model, hardware=hardware, state=JobState.SUCCEEDED)
    JobFactory(hardware=hardware)
    assert api_client.get(f"/api/v1/jobs/?model={model.slug}").json()["count"] == 2
    assert api_client.get(f"/api/v1/jobs/?hardware={hardware.slug}&state=queued").json()["count"] == 1
    assert api_client.get("/api/v1/jobs/?state=bogus").status_code == 400


@pytest.mark.parametrize("start", list(JobState.values))
def test_the_state_machine_allows_exactly_its_table(start: str) -> None:
    for target in JobState.values:
        job = JobFactory(state=start)
        if target in ALLOWED_TRANSITIONS[start]:
            do_transition_job(job, target)
            assert Job.objects.get(pk=job.pk).state == target
        else:
            with pytest.raises(InvalidTransition, match=f"from {start} to {target}"):
                do_transition_job(job, target)


def test_dispatch_counts_attempts_and_timestamps() -> None:
    job = JobFactory(state=JobState.QUEUED)
    do_transition_job(job, JobState.DISPATCHED)
    do_transition_job(job, JobState.RUNNING)
    do_transition_job(job, JobState.LOST, error="worker vanished")
    do_transition_job(job, JobState.QUEUED)
    do_transition_job(job, JobState.DISPATCHED)
    job.refresh_from_db()
    assert job.attempts == 2 and job.error == "" and job.finished_at is None and job.started_at is not None
    do_transition_job(job, JobState.RUNNING)
    do_transition_job(job, JobState.SUCCEEDED)
    job.refresh_from_db()
    assert job.finished_at is not None


def test_a_job_without_organization_is_cancelled_only_by_its_requester(api_client) -> None:
    requester = make_token(organization=OrganizationFactory())
    job = JobFactory(organization=None, requested_by=requester.user, state=JobState.QUEUED)
    stranger = make_token(organization=OrganizationFactory(), role=Role.SUBMITTER)
    assert api_client.post(f"/api/v1/jobs/{job.pk}/cancel/", **auth(stranger)).status_code == 403
    assert api_client.post(f"/api/v1/jobs/{job.pk}/cancel/", **auth(requester)).status_code == 200


def test_a_read_token_cannot_cancel_even_its_users_own_job(api_client) -> None:
    org = OrganizationFactory()
    writer = make_token(organization=org)
    reader = make_token(organization=org, user=writer.user, scopes=["read"], name="read-only")
    job = JobFactory(organization=org, requested_by=writer.user, state=JobState.QUEUED)
    response = api_client.post(f"/api/v1/jobs/{job.pk}/cancel/", **auth(reader))
    assert response.status_code == 403 and "submit" in response.json()["detail"]
    job.refresh_from_db()
    assert job.state == JobState.QUEUED
    assert api_client.post(f"/api/v1/jobs/{job.pk}/cancel/", **auth(writer)).status_code == 200
