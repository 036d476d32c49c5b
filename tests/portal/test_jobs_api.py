"""Jobs: submit (stored queued, dispatched after commit), list, cancel, and the state machine."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.choices import Role
from apps.jobs import services
from apps.jobs.choices import ALLOWED_TRANSITIONS, JobState
from apps.jobs.models import Job
from apps.jobs.services import InvalidTransition, do_transition_job
from apps.matrix.models import Cell
from contract import queues
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


# --- agents claim and finish only their own jobs -------------------------------------------------------------


def register(api_client, token, hostname: str) -> int:  # noqa: ANN001
    response = api_client.post("/api/v1/agents/", {"hostname": hostname}, format="json", **auth(token))
    assert response.status_code == 201, response.content
    return response.json()["id"]


@pytest.fixture
def two_agents(api_client) -> tuple:  # noqa: ANN001
    """A dispatched job and two agent tokens of its hardware, each with a registered agent."""
    org = OrganizationFactory()
    hardware = HardwareFactory()
    job = JobFactory(model=ModelReleaseFactory(organization=org), hardware=hardware, state=JobState.QUEUED)
    do_transition_job(job, JobState.DISPATCHED)
    mine = make_token(organization=org, scopes=["agent"], hardware=hardware, name="mine")
    theirs = make_token(organization=org, scopes=["agent"], hardware=hardware, name="theirs")
    return job, (mine, register(api_client, mine, "host-a")), (theirs, register(api_client, theirs, "host-b"))


def post_state(api_client, job, token, **body):  # noqa: ANN001, ANN201
    return api_client.post(f"/api/v1/jobs/{job.pk}/state/", body, format="json", **auth(token))


def test_an_agent_claims_a_dispatched_job_only_with_an_agent_id_of_its_own_token(api_client, two_agents) -> None:
    job, (mine, my_agent), (_, their_agent) = two_agents
    refused = post_state(api_client, job, mine, state="running", agent=their_agent)
    assert refused.status_code == 403 and f"agent {their_agent} is not registered with this token" in refused.json()[
        "detail"]
    anonymous = post_state(api_client, job, mine, state="running")
    assert anonymous.status_code == 400 and "agent" in anonymous.json()
    stale = post_state(api_client, job, mine, state="running", agent=my_agent, attempt=job.attempts + 1)
    assert stale.status_code == 409 and "stale delivery" in stale.json()["detail"]
    for portal_only in ("queued", "lost", "dispatched"):
        answer = post_state(api_client, job, mine, state=portal_only, agent=my_agent)
        assert answer.status_code == 400 and portal_only in answer.json()["state"][0], portal_only
    assert Job.objects.get(pk=job.pk).state == JobState.DISPATCHED  # nothing above moved it
    claim = post_state(api_client, job, mine, state="running", agent=my_agent, attempt=job.attempts)
    assert claim.status_code == 200 and claim.json()["state"] == "running" and claim.json()["agent"] == my_agent
    again = post_state(api_client, job, mine, state="running", agent=my_agent)
    assert again.status_code == 409 and "claims only a dispatched job" in again.json()["detail"]


def test_only_the_claiming_agent_finishes_or_reports_on_its_job(api_client, two_agents) -> None:
    job, (mine, my_agent), (theirs, their_agent) = two_agents
    assert post_state(api_client, job, mine, state="succeeded", agent=my_agent).status_code == 409  # not running
    assert post_state(api_client, job, mine, state="running", agent=my_agent).status_code == 200
    for body in ({"state": "succeeded", "agent": their_agent}, {"state": "failed", "error": "sabotage"}):
        answer = post_state(api_client, job, theirs, **body)
        assert answer.status_code == 403 and f"run by agent {my_agent}" in answer.json()["detail"], body
    events = [{"seq": 1, "ts": "2026-01-01T00:00:00Z", "kind": "log", "message": "forged"}]
    assert api_client.post(f"/api/v1/jobs/{job.pk}/events/", {"events": events}, format="json",
                           **auth(theirs)).status_code == 403
    assert api_client.post(f"/api/v1/jobs/{job.pk}/results/", {"stage": "plan", "section": {}}, format="json",
                           **auth(theirs)).status_code == 403
    assert Job.objects.get(pk=job.pk).state == JobState.RUNNING and not job.events.exists()
    done = post_state(api_client, job, mine, state="succeeded", agent=my_agent)  # the claimant finishes it
    assert done.status_code == 200 and done.json()["state"] == "failed"  # no verdict for its stages: not a success
    assert done.json()["error"].startswith("no result for stages: ")


def test_a_second_token_cannot_take_over_a_registered_host_or_beat_for_it(api_client, two_agents) -> None:
    job, (mine, my_agent), (theirs, _) = two_agents
    takeover = api_client.post("/api/v1/agents/", {"hostname": "host-a"}, format="json", **auth(theirs))
    assert takeover.status_code == 409 and "another active agent token" in takeover.json()["detail"]
    beat = api_client.post(f"/api/v1/agents/{my_agent}/heartbeat/", {"current_job": None}, format="json",
                           **auth(theirs))
    assert beat.status_code == 403
    from apps.accounts.services import do_revoke_api_token

    do_revoke_api_token(mine)  # a rotated token: the host re-registers with the new one
    assert api_client.post("/api/v1/agents/", {"hostname": "host-a"}, format="json", **auth(theirs)).json()[
        "id"] == my_agent


# --- dispatch: attempt cap, broker down, jobs nobody claims ---------------------------------------------------


def test_a_job_that_used_up_its_attempts_fails_instead_of_being_dispatched_again(monkeypatch) -> None:
    monkeypatch.setenv("DAY0_JOB_MAX_ATTEMPTS", "2")
    job = JobFactory(state=JobState.QUEUED, attempts=2)
    services.do_dispatch_job(job.pk)
    job.refresh_from_db()
    assert job.state == JobState.FAILED and job.attempts == 2
    assert "gave up after 2 attempts (DAY0_JOB_MAX_ATTEMPTS=2)" in job.error


def test_a_dispatch_the_broker_refuses_stays_queued_with_the_reason_and_counts_no_attempt(monkeypatch) -> None:
    from celery import Celery

    from apps.jobs import dispatch
    from tests.live_services import free_port

    dead = Celery("dead-broker", broker=f"redis://127.0.0.1:{free_port()}/0")  # nothing listens there
    dead.conf.update(broker_connection_retry=False, broker_connection_max_retries=0,
                     broker_transport_options={"max_retries": 0})

    def send_to_dead_broker(job: Job) -> None:
        dead.send_task(queues.RUN_JOB_TASK, args=[job.pk], queue=queues.hardware_queue(job.hardware.slug),
                       retry=False)

    monkeypatch.setattr(dispatch, "send_job", send_to_dead_broker)
    job = JobFactory(state=JobState.QUEUED)
    for _ in range(4):  # the periodic re-dispatch of a broker that stays down never exhausts the job
        services.do_dispatch_job(job.pk)
    job.refresh_from_db()
    assert job.state == JobState.QUEUED and job.attempts == 0 and job.dispatched_at is None
    assert job.error.startswith("dispatch failed, will retry:")


@pytest.mark.parametrize(("heartbeat_age", "expected"), [
    (None, "no agent of {hw} is online; none has ever registered"),
    (timedelta(minutes=10), "no agent of {hw} is online; the last heartbeat was 10 min ago"),
    (timedelta(seconds=5), "1 agent(s) of {hw} online, but none took it from queue hw.{hw}"),
])
def test_a_dispatched_job_nobody_claims_says_why_on_the_api_and_the_job_page(
        api_client, client, monkeypatch, heartbeat_age, expected) -> None:  # noqa: ANN001
    from apps.fleet.models import Agent

    monkeypatch.setenv("DAY0_JOB_STUCK_SECONDS", "60")
    org = OrganizationFactory()
    token = make_token(organization=org)
    job = JobFactory(model=ModelReleaseFactory(organization=org, visibility="public"), state=JobState.QUEUED)
    do_transition_job(job, JobState.DISPATCHED)
    if heartbeat_age is not None:
        Agent.objects.create(hardware=job.hardware, hostname="h", last_heartbeat_at=timezone.now() - heartbeat_age)
    fresh = api_client.get(f"/api/v1/jobs/{job.pk}/", **auth(token)).json()
    assert fresh["stuck"] is False and fresh["waiting_reason"] is None  # 60 s have not passed yet
    Job.objects.filter(pk=job.pk).update(dispatched_at=timezone.now() - timedelta(seconds=90))
    detail = api_client.get(f"/api/v1/jobs/{job.pk}/", **auth(token)).json()
    assert detail["stuck"] is True and "dispatched 90 s ago" in detail["waiting_reason"], detail
    assert expected.format(hw=job.hardware.slug) in detail["waiting_reason"]
    listed = api_client.get("/api/v1/jobs/?state=dispatched", **auth(token)).json()["results"]
    assert listed[0]["waiting_reason"] == detail["waiting_reason"]
    page = client.get(f"/jobs/{job.pk}/")
    assert page.status_code == 200
    assert 'id="job-waiting"' in page.content.decode() and expected.format(hw=job.hardware.slug) in page.content.decode()
    if heartbeat_age is not None and heartbeat_age < timedelta(minutes=1):  # online: says what keeps it busy
        JobFactory(hardware=job.hardware, state=JobState.RUNNING, purpose="reference")
        busy = api_client.get(f"/api/v1/jobs/{job.pk}/", **auth(token)).json()["waiting_reason"]
        assert busy.endswith(f"1 job(s) running on {job.hardware.slug}, 1 of them a release's reference run; "
                             "it waits its turn"), busy


def test_no_agent_reports_on_a_job_before_claiming_it(api_client, two_agents) -> None:
    job, (mine, my_agent), _ = two_agents
    events = [{"seq": 1, "ts": "2026-01-01T00:00:00Z", "kind": "stage_finished", "message": "plan passed"}]
    early = api_client.post(f"/api/v1/jobs/{job.pk}/events/", {"events": events}, format="json", **auth(mine))
    assert early.status_code == 409 and "claims it (state running) before" in early.json()["detail"]
    result = api_client.post(f"/api/v1/jobs/{job.pk}/results/", {"stage": "plan", "section": {}}, format="json",
                             **auth(mine))
    assert result.status_code == 409 and not job.events.exists()
    assert post_state(api_client, job, mine, state="running", agent=my_agent).status_code == 200
    late = api_client.post(f"/api/v1/jobs/{job.pk}/events/", {"events": events}, format="json", **auth(mine))
    assert late.status_code == 200 and late.json()["acked"] == 1
