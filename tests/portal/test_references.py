"""Portal-held references and challenges through the REST API with real agent tokens (docs/references.md): a
reference job posts the reference; a certify job's raw outputs are scored by the portal against it, so the align
end-to-end part and the eval verdict pass only on answers that match; forged, replayed, missing or undrawn
answers fail or stay incomplete naming why, and the tier stays; the reference never reaches an agent."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from django.test import Client

from apps.catalog.models import Hardware
from apps.evidence.models import StageResult
from apps.jobs import dispatch, services
from apps.jobs.choices import JobPurpose, JobState
from apps.jobs.models import Job
from apps.matrix.models import Cell
from apps.references.models import Challenge, ReferenceRun
from tests.factories import (
    HardwareFactory,
    JobFactory,
    ModelReleaseFactory,
    OrganizationFactory,
    UserFactory,
    auth,
    make_token,
)
from tests.portal.challenges import raw_outputs, reference_section, with_raw
from tests.portal.reports import PASSING, passing

pytestmark = pytest.mark.django_db


@pytest.fixture
def world() -> dict[str, Any]:
    reference_hw = HardwareFactory(slug="ref-cpu")
    Hardware.objects.filter(pk=reference_hw.pk).update(reference=True)
    reference_hw.refresh_from_db()
    hardware = HardwareFactory()
    return {"model": ModelReleaseFactory(), "reference_hw": reference_hw, "hardware": hardware,
            "reference_token": make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=reference_hw),
            "token": make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware),
            "staff": UserFactory(is_staff=True)}


def _start(job: Job) -> dict[str, Any]:
    """Dispatches ``job`` as the portal does (drawing its challenge) and lets it run; the payload it was sent."""
    services.do_dispatch_job(job.pk)
    job.refresh_from_db()
    services.do_transition_job(job, JobState.RUNNING)
    return dispatch.task_payload(Job.objects.get(pk=job.pk))


def _post(client: Any, job: Job, token: Any, doc: dict[str, Any]) -> Any:
    job.refresh_from_db()
    body = {**doc, "attempt": job.attempts, "nonce": job.nonce}
    return client.post(f"/api/v1/jobs/{job.pk}/results/", body, format="json", **auth(token))


def _queue_reference(world: dict[str, Any], django_capture_on_commit_callbacks: Any) -> Job:
    session = Client()
    session.force_login(world["staff"])
    with django_capture_on_commit_callbacks(execute=True):
        response = session.post(f"/api/v1/models/{world['model'].slug}/reference/",
                                {"model_path": "/srv/weights/tiny"}, content_type="application/json")
    assert response.status_code == 201, response.content
    return Job.objects.get(pk=response.json()["job"])


def _finish_reference(api_client: Any, world: dict[str, Any], django_capture_on_commit_callbacks: Any) -> Job:
    job = _queue_reference(world, django_capture_on_commit_callbacks)
    payload = dispatch.task_payload(job)  # dispatched at commit
    job.refresh_from_db()
    services.do_transition_job(job, JobState.RUNNING)
    response = _post(api_client, job, world["reference_token"],
                     {"stage": "reference", "section": reference_section(payload)})
    assert response.status_code == 201, response.content
    return job


def _certify(world: dict[str, Any], stages: list[str] | None = None) -> tuple[Job, dict[str, Any]]:
    spec = {"stages": stages or ["plan", "load", "align", "serve", "bench", "eval"], "dtype": "bfloat16"}
    job = JobFactory(model=world["model"], hardware=world["hardware"], state=JobState.QUEUED, spec=spec)
    return job, _start(job)


def _climb(api_client: Any, job: Job, token: Any, stages: list[str]) -> None:
    for stage in stages:
        response = _post(api_client, job, token, {"stage": stage, "section": passing(stage)})
        assert response.json()["stored"][0]["verdict"] == "pass", response.content


def test_a_reference_job_computes_and_posts_the_reference(api_client, world,
                                                          django_capture_on_commit_callbacks) -> None:
    job = _queue_reference(world, django_capture_on_commit_callbacks)
    assert (job.purpose, job.hardware_id, job.stages, job.state) == (
        JobPurpose.REFERENCE, world["reference_hw"].pk, ["load", "reference"], JobState.DISPATCHED)
    assert job.spec["model_path"] == "/srv/weights/tiny" and job.spec["dtype"] == "float32"
    payload = dispatch.task_payload(job)
    pool = payload["reference_pool"]
    assert "challenge" not in payload and {k: len(pool[k]) for k in ("e2e", "mc", "qa", "ppl")} == {
        "e2e": 48, "mc": 231, "qa": 72, "ppl": 8}
    assert len(pool["needle"]) == 2 * 5 * 3  # two fresh needles per length (256, 512, 1024) and depth
    assert "answer" not in json.dumps(pool["mc"][0])
    job.refresh_from_db()
    services.do_transition_job(job, JobState.RUNNING)
    response = _post(api_client, job, world["reference_token"],
                     {"stage": "reference", "section": reference_section(payload)})
    assert response.status_code == 201, response.content
    run = ReferenceRun.objects.get(job=job)
    assert run.state == "finished" and len(run.outputs["mc"]) == 231
    assert run.outputs["needle_accuracy"]["256"]["accuracy"] == 1.0
    listed = api_client.get(f"/api/v1/models/{world['model'].slug}/reference/", **auth(world["token"])).json()
    assert listed["runs"][0]["state"] == "finished" and "outputs" not in json.dumps(listed)
    # the reference hardware's cell serves the stored section: a summary, never the outputs
    cell = api_client.get(f"/api/v1/cells/{world['model'].slug}/{world['reference_hw'].slug}/",
                          **auth(world["token"])).json()
    assert cell["evidence"]["stages"]["reference"]["section"]["answered"]["mc"] == 231
    assert "top_logprobs" not in json.dumps(cell)


def test_only_a_reference_job_on_reference_hardware_posts_a_reference(api_client, world,
                                                                      django_capture_on_commit_callbacks) -> None:
    reference_job = _queue_reference(world, django_capture_on_commit_callbacks)
    payload = dispatch.task_payload(reference_job)
    section = reference_section(payload)
    # a certify job that asked for the stage, on ordinary hardware: 403 naming the rule
    job = JobFactory(model=world["model"], hardware=world["hardware"], spec={"stages": ["load", "reference"]})
    response = _post(api_client, job, world["token"], {"stage": "reference", "section": section})
    assert response.status_code == 403 and "only a reference job on hardware marked reference" in str(
        response.json()), response.content
    reference_job.refresh_from_db()
    services.do_transition_job(reference_job, JobState.RUNNING)
    short = {**copy.deepcopy(section), "mc": section["mc"][1:]}
    response = _post(api_client, reference_job, world["reference_token"], {"stage": "reference", "section": short})
    assert response.status_code == 400 and "mc: 1 of 231 drawn items not answered (mc-000)" in str(response.json())
    stale = {**copy.deepcopy(section), "nonce": "0" * 32}
    response = _post(api_client, reference_job, world["reference_token"], {"stage": "reference", "section": stale})
    assert response.status_code == 400 and "stages.reference.nonce" in response.json()
    assert ReferenceRun.objects.get(job=reference_job).state == "queued"  # nothing stored
    assert not StageResult.objects.filter(stage="reference").exists()


def test_before_any_reference_the_gates_await_it_then_are_judged_again(api_client, world,
                                                                       django_capture_on_commit_callbacks) -> None:
    job, payload = _certify(world)
    # no reference yet: p0 = 0.5, ((1.645 * 0.5 + 0.842 * sqrt(0.24)) / 0.1)^2 = 152.5 -> 153 mc items; qa's 72 cap
    assert payload["challenge"]["sizes"]["mc"]["n"] == 153 == len(payload["challenge"]["mc"])
    qa = Challenge.objects.get(job=job).sizes["qa"]
    assert (qa["n"], qa["wanted"], qa["capped"], qa["p0"]) == (72, 153, True, 0.5)
    raw = raw_outputs(payload["challenge"])
    _climb(api_client, job, world["token"], ["plan", "load", "serve"])
    sections = with_raw(passing("align"), PASSING["eval"], raw)
    body = _post(api_client, job, world["token"], {"stage": "align", "section": sections["align"]}).json()
    assert body["stored"][0]["verdict"] == "incomplete"
    assert "align: e2e: awaiting reference: the release has no finished reference run" in body["stored"][0]["reasons"]
    assert body["cell"]["tier"] == 3
    _finish_reference(api_client, world, django_capture_on_commit_callbacks)
    stored = StageResult.objects.get(job=job, stage="align")
    assert stored.verdict == "pass", stored.reasons
    assert stored.challenge_scores["e2e"]["token_match_rate"] == 1.0
    assert Cell.objects.get(model=world["model"], hardware=world["hardware"]).tier == 4


def test_matching_raw_outputs_pass_align_and_eval_with_the_portals_scores(api_client, world,
                                                                          django_capture_on_commit_callbacks) -> None:
    _finish_reference(api_client, world, django_capture_on_commit_callbacks)
    job, payload = _certify(world)
    challenge = payload["challenge"]
    assert len(challenge["e2e"]) == 8 and challenge["sizes"]["mc"]["n"] == len(challenge["mc"])
    # the reference's accuracy over the pool is 1.0 here: the power rule asks ((1.645 * 0 + 0.842 * 0.3) / 0.1)^2 =
    # 6.4 items, below the floor of 20
    assert challenge["sizes"]["mc"]["n"] == 20 and len(challenge["qa"]) == 20
    raw = raw_outputs(challenge)
    sections = with_raw(passing("align"), PASSING["eval"], raw)
    sections["align"]["e2e"]["token_match_rate"] = 0.0  # the agent's own numbers are claims
    _climb(api_client, job, world["token"], ["plan", "load", "serve"])
    body = _post(api_client, job, world["token"], {"stage": "align", "section": sections["align"]}).json()
    align = body["stored"][0]
    assert align["verdict"] == "pass", align["reasons"]
    assert align["scores"]["e2e"]["n"] == 8 and align["scores"]["e2e"]["token_match_rate"] == 1.0
    _climb(api_client, job, world["token"], ["bench"])
    body = _post(api_client, job, world["token"], {"stage": "eval", "section": sections["eval"]}).json()
    scores = body["stored"][0]["scores"]
    assert body["stored"][0]["verdict"] == "pass" and body["cell"]["tier"] == 6, body
    assert scores["mc"]["target"]["accuracy"] == 1.0 and scores["mc"]["target"]["n"] == 20
    assert scores["sizes"]["mc"]["p0"] == 1.0 and "sqrt" in scores["sizes"]["mc"]["rule"]
    assert [row["length"] for row in scores["needle"]] == [256, 512, 1024]
    cell = api_client.get(f"/api/v1/cells/{world['model'].slug}/{world['hardware'].slug}/",
                          **auth(world["token"])).json()
    assert cell["evidence"]["stages"]["eval"]["scores"] == scores  # the cell API shows the portal's scores too
    assert cell["evidence"]["stages"]["align"]["scores"]["e2e"]["n"] == 8
    assert cell["evidence"]["stages"]["bench"]["scores"] is None
    page = Client().get(f"/cells/{world['model'].slug}/{world['hardware'].slug}/").content.decode()
    block = page[page.index('id="portal-scores"'):page.index('id="evaluation"')]
    assert "100.0 % (128 of 128 tokens over 8 prompts; at least 90.0 %)" in block  # 16 tokens each
    assert "<td>multiple choice (accuracy)</td><td class=\"num\" data-label=\"n\">20</td>" in block
    assert "[83.9 %, 100.0 %]" in block and "n = 20: drop θ 0.1 from p0 1.000 at α 0.05, β 0.2" in block


def _forge(kind: str) -> Any:
    def forge(raw: dict[str, Any], other: dict[str, Any]) -> None:
        if kind == "wrong tokens":
            for item in raw["align"]["items"]:
                item["tokens"] = [7] * len(item["tokens"])
                item["top_logprobs"] = [[{"token": 7, "logprob": -0.01}]] * len(item["tokens"])
        elif kind == "zero loglikelihoods":
            for item in raw["eval"]["mc"]:
                item["loglikelihoods"] = [0.0] * len(item["loglikelihoods"])
        elif kind == "another job's nonce":
            raw["align"]["nonce"] = raw["eval"]["nonce"] = other["nonce"]
        elif kind == "missing items":
            raw["align"]["items"].pop()
            raw["eval"]["qa"] = raw["eval"]["qa"][:-2]
        elif kind == "items not drawn":
            drawn = {i["id"] for i in raw["eval"]["mc"]}
            spare = next(f"mc-{n:03d}" for n in range(231) if f"mc-{n:03d}" not in drawn)
            raw["eval"]["mc"][0]["id"] = spare
            raw["align"]["items"][0]["id"] = "e2e-999"
        elif kind == "no raw outputs":
            raw["align"] = raw["eval"] = None
    return forge


FORGERIES = [
    ("wrong tokens", "fail", "fail" , "position 0: target token 7 and the reference's differ", None),
    ("zero loglikelihoods", "pass", "fail", None, "sum past 1: these are not log-likelihoods"),
    ("another job's nonce", "incomplete", "incomplete", "their nonce is not this attempt's",
     "their nonce is not this attempt's"),
    ("missing items", "incomplete", "incomplete", "1 of 8 drawn items not answered", "2 of 20 drawn items not answered"),
    ("items not drawn", "incomplete", "incomplete", "answer(s) to items that were not drawn (e2e-999)",
     "answer(s) to items that were not drawn"),
    ("no raw outputs", "incomplete", "incomplete", "e2e: raw outputs missing", "eval: raw outputs missing"),
]


@pytest.mark.parametrize(("kind", "align_verdict", "eval_verdict", "align_reason", "eval_reason"), FORGERIES,
                         ids=[f[0] for f in FORGERIES])
def test_forged_raw_outputs_fail_or_stay_incomplete_and_the_tier_stays(
        api_client, world, django_capture_on_commit_callbacks, kind, align_verdict, eval_verdict, align_reason,
        eval_reason) -> None:
    _finish_reference(api_client, world, django_capture_on_commit_callbacks)
    job, payload = _certify(world)
    _, other_payload = _certify(world)
    raw = raw_outputs(payload["challenge"])
    _forge(kind)(raw, other_payload)
    sections = with_raw(passing("align"), PASSING["eval"], raw) if raw["align"] else {
        "align": passing("align"), "eval": copy.deepcopy(PASSING["eval"])}
    _climb(api_client, job, world["token"], ["plan", "load", "serve"])
    body = _post(api_client, job, world["token"], {"stage": "align", "section": sections["align"]}).json()
    align = body["stored"][0]
    assert align["verdict"] == align_verdict, align["reasons"]
    if align_reason:
        assert any(align_reason in r for r in align["reasons"]), align["reasons"]
        assert body["cell"]["tier"] == 3 and align["disputed"] is True  # the agent claimed a pass
    if align_verdict != "pass":
        return
    _climb(api_client, job, world["token"], ["bench"])
    body = _post(api_client, job, world["token"], {"stage": "eval", "section": sections["eval"]}).json()
    stored = body["stored"][0]
    assert stored["verdict"] == eval_verdict and any(eval_reason in r for r in stored["reasons"]), stored["reasons"]
    assert body["cell"]["tier"] == 5


def test_forged_eval_answers_name_why(api_client, world, django_capture_on_commit_callbacks) -> None:
    """The eval half of the forgeries whose align half already fails above."""
    _finish_reference(api_client, world, django_capture_on_commit_callbacks)
    _, other = _certify(world, ["eval"])
    for kind, reason in (("another job's nonce", "their nonce is not this attempt's"),
                         ("missing items", "qa: 2 of 20 drawn items not answered"),
                         ("items not drawn", "mc: 1 answer(s) to items that were not drawn"),
                         ("no raw outputs", "eval: raw outputs missing")):
        job, payload = _certify(world, ["eval"])  # one job each: an attempt posts a stage once
        raw = raw_outputs(payload["challenge"])
        raw["align"] = {"nonce": "x", "items": [{"id": "e2e-000"}]}
        _forge(kind)(raw, other)
        section = {**copy.deepcopy(PASSING["eval"]), "raw": raw["eval"]} if raw["eval"] else PASSING["eval"]
        stored = _post(api_client, job, world["token"], {"stage": "eval", "section": section}).json()["stored"][0]
        assert stored["verdict"] == "incomplete" and any(reason in r for r in stored["reasons"]), (kind, stored)


def test_raw_outputs_of_an_earlier_attempt_answer_another_challenge(api_client, world,
                                                                    django_capture_on_commit_callbacks) -> None:
    _finish_reference(api_client, world, django_capture_on_commit_callbacks)
    job, first = _certify(world, ["align"])
    job.refresh_from_db()
    services.do_transition_job(job, JobState.QUEUED)  # lost and re-queued: a new attempt, a new challenge
    second = _start(job)
    assert second["attempt"] == 2 and second["challenge"]["nonce"] != first["challenge"]["nonce"]
    replayed = with_raw(passing("align"), None, raw_outputs(first["challenge"]))["align"]
    stored = _post(api_client, job, world["token"], {"stage": "align", "section": replayed}).json()["stored"][0]
    assert stored["verdict"] == "incomplete" and any("their nonce is not this attempt's" in r
                                                     for r in stored["reasons"]), stored
    job.refresh_from_db()
    services.do_transition_job(job, JobState.QUEUED)  # once more: an attempt answers its own challenge
    third = _start(job)
    honest = with_raw(passing("align"), None, raw_outputs(third["challenge"]))["align"]
    stored = _post(api_client, job, world["token"], {"stage": "align", "section": honest}).json()["stored"][0]
    assert stored["verdict"] == "pass", stored


def test_the_reference_reaches_no_agent(api_client, world, django_capture_on_commit_callbacks) -> None:
    _finish_reference(api_client, world, django_capture_on_commit_callbacks)
    run = ReferenceRun.objects.get()
    job, payload = _certify(world)
    assert "reference_pool" not in payload and set(payload["challenge"]) >= {"nonce", "e2e", "mc", "qa", "ppl"}
    challenge = Challenge.objects.get(job=job)
    first_mc = payload["challenge"]["mc"][0]["id"]
    secrets = [json.dumps(run.outputs["e2e"]["e2e-000"]["tokens"]),
               json.dumps(run.outputs["mc"][first_mc]["loglikelihoods"]), '"answer"']
    seen = json.dumps(payload) + api_client.get(f"/api/v1/jobs/{job.pk}/", **auth(world["token"])).content.decode()
    seen += api_client.get(f"/api/v1/models/{world['model'].slug}/", **auth(world["token"])).content.decode()
    seen += api_client.get(f"/api/v1/models/{world['model'].slug}/reference/", **auth(world["token"])).content.decode()
    assert not [s for s in secrets if s in seen]
    assert challenge.keys["mc"][first_mc]["answer"] in (0, 1, 2, 3)  # the keys stay with the portal
    # a reference job on hardware that is not marked reference gets no pool
    stray = JobFactory(model=world["model"], hardware=world["hardware"], state=JobState.QUEUED,
                       spec={"stages": ["load", "reference"]})
    Job.objects.filter(pk=stray.pk).update(purpose=JobPurpose.REFERENCE)
    ReferenceRun.objects.create(release=world["model"], pool_version=run.pool_version, source="x", job=stray)
    assert "reference_pool" not in _start(Job.objects.get(pk=stray.pk))


def test_a_release_created_with_a_reference_source_queues_its_reference(api_client, world,
                                                                        django_capture_on_commit_callbacks) -> None:
    submitter = make_token(organization=world["model"].organization)
    config = dict(world["model"].config)
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.post("/api/v1/models/", {
            "slug": "with-reference", "name": "With reference", "released_at": "2026-12-01T00:00:00Z",
            "config": config, "reference_source": "HuggingFaceTB/SmolLM2-135M"}, format="json", **auth(submitter))
    assert response.status_code == 201, response.content
    run = ReferenceRun.objects.get(release__slug="with-reference")
    assert run.job.purpose == JobPurpose.REFERENCE and run.job.hardware == world["reference_hw"]
    assert run.job.spec["model_path"] == "HuggingFaceTB/SmolLM2-135M"
    from django.core.management import call_command

    call_command("queue_references", stdout=open("/dev/null", "w"))  # noqa: SIM115 (idempotent: nothing new)
    assert ReferenceRun.objects.filter(release__slug="with-reference").count() == 1
    response = api_client.post(f"/api/v1/models/{world['model'].slug}/reference/", {}, format="json",
                               **auth(submitter))
    assert response.status_code == 403  # staff only
