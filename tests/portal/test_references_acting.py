"""The challenge's acting items through the REST API (docs/references.md): a reference run answers every HumanEval
problem and agent_kv episode of the pool, its section refused with a 400 naming the item when a hash is not the
completion's, an action follows the episode's end or an item is missing (nothing stored); a certify attempt draws
the configured sample; the target's raw code and agent answers are scored by the portal."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from django.test import Client

from apps.catalog.models import Hardware
from apps.evidence.models import StageResult
from apps.jobs import dispatch, services
from apps.jobs.choices import JobState
from apps.jobs.models import Job
from apps.references.models import Challenge, ReferenceRun
from contract.challenges import pool as cp
from tests.factories import (
    HardwareFactory,
    JobFactory,
    ModelReleaseFactory,
    OrganizationFactory,
    UserFactory,
    make_token,
)
from tests.portal.challenges import raw_outputs, reference_section
from tests.portal.reports import passing
from tests.portal.test_references import _post, _queue_reference, _start

pytestmark = pytest.mark.django_db

@pytest.fixture
def world() -> dict[str, Any]:
    """Reference hardware with its agent token, an ordinary host with its own, and a release (as in
    test_references)."""
    reference_hw = HardwareFactory(slug="ref-cpu")
    Hardware.objects.filter(pk=reference_hw.pk).update(reference=True)
    reference_hw.refresh_from_db()
    hardware = HardwareFactory()
    return {"model": ModelReleaseFactory(), "reference_hw": reference_hw, "hardware": hardware,
            "reference_token": make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=reference_hw),
            "token": make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware),
            "staff": UserFactory(is_staff=True)}


FINISH = json.dumps({"tool": "finish", "args": {}}, sort_keys=True)


@pytest.mark.parametrize(("change", "phrase"), [
    (lambda s: s["code"][3].update(sha256="0" * 64),
     "code humaneval-003: sha256 is not the sha256 of the completion as run"),
    (lambda s: s["agent"][2].update(actions=[FINISH, FINISH]),
     "agent agent-002: action 2 comes after the episode ended at turn 1"),
    (lambda s: s["code"].pop(0), f"code: 1 of {cp.CODE_POOL} drawn items not answered (humaneval-000)"),
    (lambda s: s["agent"][0].update(actions="finish"), "agent agent-000: actions must be a list of at most 8"),
])
def test_a_reference_with_a_bad_acting_answer_is_a_400_naming_it(api_client, world, change, phrase,
                                                                  django_capture_on_commit_callbacks) -> None:
    job = _queue_reference(world, django_capture_on_commit_callbacks)
    payload = dispatch.task_payload(job)
    pool = payload["reference_pool"]
    assert (len(pool["code"]), len(pool["agent"])) == (cp.CODE_POOL, cp.AGENT_POOL)
    assert "test" not in pool["code"][0] and "goal" not in pool["agent"][0]
    job.refresh_from_db()
    services.do_transition_job(job, JobState.RUNNING)
    section = reference_section(payload)
    bad = copy.deepcopy(section)
    change(bad)
    response = _post(api_client, job, world["reference_token"], {"stage": "reference", "section": bad})
    assert response.status_code == 400 and phrase in str(response.json()), response.content
    assert ReferenceRun.objects.get(job=job).state == "queued" and not StageResult.objects.filter(
        stage="reference").exists()
    response = _post(api_client, job, world["reference_token"], {"stage": "reference", "section": section})
    assert response.status_code == 201, response.content
    outputs = ReferenceRun.objects.get(job=job).outputs
    assert set(outputs["code"]["humaneval-000"]) == {"completion", "sha256", "passed", "status"}
    assert set(outputs["agent"]["agent-000"]) == {"actions"}  # a claimed success is not kept


def test_a_certify_eval_is_scored_on_its_code_and_agent_answers(api_client, world,
                                                                django_capture_on_commit_callbacks) -> None:
    reference = _queue_reference(world, django_capture_on_commit_callbacks)
    payload = dispatch.task_payload(reference)
    reference.refresh_from_db()
    services.do_transition_job(reference, JobState.RUNNING)
    assert _post(api_client, reference, world["reference_token"],
                 {"stage": "reference", "section": reference_section(payload)}).status_code == 201
    job = JobFactory(model=world["model"], hardware=world["hardware"], state=JobState.QUEUED,
                     spec={"stages": ["eval"], "dtype": "bfloat16", "thresholds": {"challenge_agent_episodes": 2}})
    challenge = _start(job)["challenge"]
    assert (len(challenge["code"]), len(challenge["agent"])) == (4, 2)  # challenge_code_items' default, the job's 2
    assert Challenge.objects.get(job=job).sizes["agent"]["rule"].startswith("a fixed sample of challenge_agent_")
    raw = raw_outputs(challenge)["eval"]
    forged = copy.deepcopy(raw)
    forged["agent"][0].update(actions=[FINISH], success=True)  # no work done, success claimed
    body = {**passing("eval"), "raw": forged}
    stored = _post(api_client, job, world["token"], {"stage": "eval", "section": body}).json()["stored"][0]
    assert stored["verdict"] == "fail", stored
    assert any("replayed by the portal" in r for r in stored["reasons"]), stored
    job2 = JobFactory(model=world["model"], hardware=world["hardware"], state=JobState.QUEUED,
                      spec={"stages": ["eval"], "dtype": "bfloat16"})
    challenge2 = _start(job2)["challenge"]
    raw2 = raw_outputs(challenge2)["eval"]
    stored = _post(api_client, job2, world["token"], {"stage": "eval", "section": {**passing("eval"),
                                                                                    "raw": raw2}}).json()["stored"][0]
    assert stored["verdict"] == "pass", stored
    scores = StageResult.objects.get(job=Job.objects.get(pk=job2.pk), stage="eval").challenge_scores
    assert scores["code"]["n"] == 4 and scores["agent"]["success"] == {"reference": 1.0, "target": 1.0}
    # the cell page: the code and agent rows scored by the portal, each item's reference result beside the target's
    page = Client().get(f"/cells/{world['model'].slug}/{world['hardware'].slug}/").content.decode()
    block = page[page.index('id="acting-scored-by-portal"'):]
    block = block[: block.index("</section>")]
    humaneval = block[block.index('data-task="humaneval"'):block.index('data-task="agent_kv"')]
    assert "0.0 %" in humaneval and "identical completions 100.0 %" in humaneval and "0 disputes" in humaneval
    items = block[block.index('id="portal-acting-items"'):]
    first = challenge2["code"][0]
    row = items[items.index(f'data-item="{first["id"]}"'):]
    row = row[: row.index("</tr>")]
    assert first["task_id"] in row and "the reference run (identical completion)" in row and "✗ fails" in row
    agent_row = items[items.index(f'data-item="{challenge2["agent"][0]["id"]}"'):]
    assert "✓ succeeds" in agent_row[: agent_row.index("</tr>")] and "the portal replayed the actions" in agent_row


def test_the_portals_worker_reruns_code_unlike_the_references_and_a_false_claim_fails(
        api_client, world, django_capture_on_commit_callbacks, monkeypatch) -> None:
    from apps.evidence import tasks
    from contract.suites import humaneval as code_suite

    reference = _queue_reference(world, django_capture_on_commit_callbacks)
    payload = dispatch.task_payload(reference)
    reference.refresh_from_db()
    services.do_transition_job(reference, JobState.RUNNING)
    assert _post(api_client, reference, world["reference_token"],
                 {"stage": "reference", "section": reference_section(payload)}).status_code == 201
    job = JobFactory(model=world["model"], hardware=world["hardware"], state=JobState.QUEUED,
                     spec={"stages": ["eval"], "dtype": "bfloat16", "thresholds": {"challenge_agent_episodes": 0}})
    challenge = _start(job)["challenge"]
    raw = raw_outputs(challenge)["eval"]
    assert "agent" not in challenge and raw["agent"] == []
    # two completions unlike the reference's, both failing their tests: one claimed to pass (forged), one honest
    for n, claimed in ((0, True), (1, False)):
        completion = "    raise ValueError('not solved')\n"
        raw["code"][n].update(completion=completion, sha256=code_suite.digest(completion), passed=claimed,
                              status="passed" if claimed else "failed")
    sent: list[int] = []
    monkeypatch.setattr(tasks.rerun_code_task, "delay", lambda pk: (sent.append(pk),
                                                                     tasks.rerun_code_task.apply(args=[pk])))
    with django_capture_on_commit_callbacks(execute=True):
        stored = _post(api_client, job, world["token"], {"stage": "eval", "section": {**passing("eval"),
                                                                                       "raw": raw}}).json()
    assert stored["stored"][0]["verdict"] == "pass", stored  # at ingest the two results are the agent's word
    result = StageResult.objects.get(job_id=job.pk, stage="eval")
    assert sent == [result.pk]  # queued for the portal's worker once the result committed
    rerun = Challenge.objects.get(job=job).reruns
    assert {rerun[challenge["code"][n]["id"]]["passed"] for n in (0, 1)} == {False}
    assert result.verdict == "fail", result.reasons
    first = challenge["code"][0]["id"]
    assert any(f"code {first}: the target's completion is claimed to pass, but the portal re-ran that completion "
               "(same sha256) and it fails: a disputed item fails" in r for r in result.reasons), result.reasons
    rows = {r["id"]: r for r in result.challenge_scores["code"]["rows"]}
    assert rows[challenge["code"][1]["id"]]["result_from"] == "the portal's re-run"
    assert not rows[challenge["code"][1]["id"]]["dispute"] and result.challenge_scores["code"]["agents_word"] == []
