"""A hardware pool's stack changes (an agent re-registers with another torch): the change is recorded, the
pool's policy queues re-validation jobs for the affected cells, and those cells show stale until new evidence."""

from __future__ import annotations

import pytest

from apps.alerts.models import Delivery, Subscription
from apps.evidence.ingest import do_record_job_results
from apps.fleet.models import StackChange
from apps.fleet.stacks import do_set_hardware_policy
from apps.jobs.choices import JobState
from apps.jobs.models import Job
from apps.jobs.services import do_transition_job
from apps.matrix.models import Cell
from apps.matrix.stacks import cell_stack
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token
from tests.portal.challenges import answered
from tests.portal.reports import TIER_STAGES, bound, failing, passing

pytestmark = pytest.mark.django_db

LOCK = {"runtime_commit": "abc1234", "torch": "2.13.0", "driver": "Linux 6.8", "toolkit": None, "device": "cpu",
        "python": "3.11.7"}


def _cell_at(model, hardware, tier: int) -> Job:
    job = JobFactory(model=model, hardware=hardware,
                     spec={"stages": [*TIER_STAGES[tier], "env"], "dtype": "bfloat16", "bench": {"input_len": 128}})
    sections = {s: passing(s) for s in TIER_STAGES[tier]}
    sections["env"] = {**passing("env"), "torch": LOCK["torch"]}
    do_record_job_results(job, bound(job, {"stages": answered(job, sections)}))
    do_transition_job(job, JobState.SUCCEEDED)
    assert Cell.objects.get(model=model, hardware=hardware).tier == tier
    return job


@pytest.mark.parametrize(("policy", "min_tier", "expected"), [("tier", 3, {"high"}), ("all", 1, {"high", "low"}),
                                                              ("off", 1, set())])
def test_a_reregistering_agent_with_another_torch_queues_the_configured_revalidation_jobs(
        api_client, policy: str, min_tier: int, expected: set[str]) -> None:
    hardware = HardwareFactory()
    models = {"high": ModelReleaseFactory(), "low": ModelReleaseFactory()}
    previous = {"high": _cell_at(models["high"], hardware, 3), "low": _cell_at(models["low"], hardware, 1)}
    do_set_hardware_policy(hardware, policy=policy, min_tier=min_tier)
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware, role="admin")
    body = {"hostname": "node-1", "versions": LOCK}
    assert api_client.post("/api/v1/agents/", body, format="json", **auth(token)).status_code == 201
    assert StackChange.objects.count() == 0, "the same stack as the evidence's is no change"
    assert api_client.post("/api/v1/agents/", body, format="json", **auth(token)).status_code == 200
    assert StackChange.objects.count() == 0

    upgraded = {**LOCK, "torch": "2.14.0"}
    assert api_client.post("/api/v1/agents/", dict(body, versions=upgraded), format="json",
                           **auth(token)).status_code == 200
    change = StackChange.objects.get()
    assert change.changed == ["torch"] and change.before["torch"] == "2.13.0" and change.after["torch"] == "2.14.0"
    queued = {Job.objects.get(pk=pk).model_id: Job.objects.get(pk=pk) for pk in change.jobs}
    assert {name for name, m in models.items() if m.pk in queued} == expected
    for name in expected:
        job = queued[models[name].pk]
        assert job.state == JobState.QUEUED and job.stages == previous[name].stages
        assert job.spec["bench"] == {"input_len": 128} and job.spec["revalidation"]["stack_change"] == change.pk
    for m in models.values():  # every cell with evidence predating the change is stale, queued or not
        stack = cell_stack(m.pk, hardware.pk)
        assert stack["stale"] and stack["stale_since"] == change.created_at.isoformat()
        assert stack["evidence_stack"]["torch"] == "2.13.0"
    # the same new stack again is no second change and queues nothing more
    api_client.post("/api/v1/agents/", dict(body, versions=upgraded), format="json", **auth(token))
    assert StackChange.objects.count() == 1 and Job.objects.filter(state=JobState.QUEUED).count() == len(expected)


def test_new_evidence_clears_stale_and_heartbeats_report_the_stack_too(api_client, monkeypatch,
                                                                      django_capture_on_commit_callbacks) -> None:
    from apps.alerts import services as alert_services

    queued: list[int] = []
    monkeypatch.setattr(alert_services, "enqueue_delivery", queued.append)  # the delivery itself: test_alerts
    hardware = HardwareFactory()
    model = ModelReleaseFactory()
    _cell_at(model, hardware, 5)  # a benchmark before the change: the series marks it
    sub = Subscription.objects.create(organization=OrganizationFactory(), name="ops", url="http://127.0.0.1:9/",
                                      kinds=["stack_change"], secret="x" * 20)
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware, role="admin")
    agent = api_client.post("/api/v1/agents/", {"hostname": "n", "versions": LOCK}, format="json",
                            **auth(token)).json()
    with django_capture_on_commit_callbacks(execute=True):  # the alert is published once the heartbeat commits
        beat = api_client.post(f"/api/v1/agents/{agent['id']}/heartbeat/",
                               {"versions": {**LOCK, "driver": "Linux 6.9"}}, format="json", **auth(token))
    assert beat.status_code == 200 and beat.json()["versions"]["driver"] == "Linux 6.9"
    change = StackChange.objects.get()
    assert change.changed == ["driver"] and change.jobs == []  # no policy: recorded only
    delivery = Delivery.objects.get()
    assert queued == [delivery.pk] and delivery.subscription_id == sub.pk and delivery.kind == "stack_change"
    assert "driver Linux 6.8 → Linux 6.9" in delivery.event["summary"]
    assert cell_stack(model.pk, hardware.pk)["stale"]
    page = api_client.get(f"/cells/{model.slug}/{hardware.slug}/").content.decode()
    assert "stale since the driver change" in page and "torch <code>2.13.0</code>" in page
    partial = JobFactory(model=model, hardware=hardware)  # a newer job proving only some stages clears nothing
    do_record_job_results(partial, bound(partial, {"stages": {"env": {**passing("env"), "driver": "Linux 6.9"},
                                                 "bench": passing("bench"), "load": failing("load")}}))
    stack = cell_stack(model.pk, hardware.pk)
    assert stack["stale"] and stack["stale_stages"] == ["align", "load", "plan", "serve"]
    fresh = JobFactory(model=model, hardware=hardware)
    do_record_job_results(fresh, bound(fresh, {"stages": answered(fresh, {s: passing(s) for s in TIER_STAGES[4]})}))
    series = api_client.get(f"/api/v1/benchmarks/?model={model.slug}&hardware={hardware.slug}").json()
    assert [(c["hardware"], c["changed"], c["after"]) for c in series["stack_changes"]] == [
        (hardware.slug, ["driver"], {"driver": "Linux 6.9"})]
    assert "stale since" not in api_client.get(f"/cells/{model.slug}/{hardware.slug}/").content.decode()
    stack = cell_stack(model.pk, hardware.pk)
    assert not stack["stale"] and stack["evidence_stack"]["driver"] == "Linux 6.9"
    answer = api_client.get(f"/api/v1/cells/{model.slug}/{hardware.slug}/", **auth(token))
    assert answer.status_code == 200 and answer.json()["stack"]["stale"] is False


def test_a_policy_is_validated() -> None:
    from django.core.exceptions import ValidationError

    hardware = HardwareFactory()
    for policy, tier, field in (("sometimes", 1, "policy"), ("tier", 0, "min_tier"), ("tier", 7, "min_tier"),
                                ("tier", True, "min_tier")):
        with pytest.raises(ValidationError) as err:
            do_set_hardware_policy(hardware, policy=policy, min_tier=tier)
        assert field in err.value.message_dict


def test_the_policy_api_is_for_the_hardwares_admins_and_names_bad_fields(api_client) -> None:
    org = OrganizationFactory()
    hardware = HardwareFactory(organization=org)
    admin, viewer = make_token(organization=org, role="admin"), make_token(organization=org, role="viewer",
                                                                             scopes=["read"])
    url = f"/api/v1/stack-policies/{hardware.slug}/"
    assert api_client.get(url, **auth(viewer)).json()["policy"] == "off"
    assert api_client.put(url, {"policy": "all"}, format="json", **auth(viewer)).status_code == 403
    for body, field in (({"policy": "never"}, "policy"), ({"policy": "tier", "min_tier": 9}, "min_tier")):
        answer = api_client.put(url, body, format="json", **auth(admin))
        assert answer.status_code == 400 and field in answer.json()
    answer = api_client.put(url, {"policy": "tier", "min_tier": 4}, format="json", **auth(admin))
    assert answer.status_code == 200 and (answer.json()["policy"], answer.json()["min_tier"]) == ("tier", 4)
    assert api_client.get("/api/v1/stack-policies/no-such-hw/", **auth(admin)).status_code == 404
    assert api_client.get(url).status_code == 401
    assert api_client.get(url, **auth(make_token(organization=OrganizationFactory()))).status_code == 404
    shared = HardwareFactory()
    assert api_client.put(f"/api/v1/stack-policies/{shared.slug}/", {"policy": "all"}, format="json",
                          **auth(admin)).status_code == 403
