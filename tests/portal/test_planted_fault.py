"""A planted accuracy fault in the served model (a wrong rope theta), judged by the portal from its own scores.

The whole path with the real parts, Celery aside: the portal queues the release's reference run on the reference
hardware; the agent's ``reference`` stage answers the whole pool with transformers fp32 on the true weights and
posts it; a vendor's certify job is dispatched (the portal draws its secret challenge) and the agent answers it
with a target whose config carries the wrong rope theta (align in process, eval through ``day0 serve``); the
portal scores those raw outputs against its reference and fails the align end-to-end part, naming the divergence.
The same job answered by the true weights passes both.

Eval judges task quality, so it fails on a model that has some: the tiny model's accuracies sit at chance on both
sides (its scores show the target picking other choices than the reference), while the real SmolLM2-135M
(``slow``) loses perplexity past ``eval_rtol`` under the same fault and its eval fails, naming it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.test import Client

from agents.pipeline.runner import run_pipeline
from agents.pipeline.support.context import StageContext
from apps.catalog.models import Hardware
from apps.evidence.models import StageResult
from apps.jobs import dispatch, services
from apps.jobs.choices import JobState
from apps.jobs.models import Job
from apps.references.models import ReferenceRun, ReferenceState
from tests.factories import (
    HardwareFactory,
    JobFactory,
    ModelReleaseFactory,
    OrganizationFactory,
    UserFactory,
    auth,
    make_token,
)
from tests.pipeline.test_challenges import _target_with_rope, sharp_llama  # noqa: F401 (the module's fixture)

pytestmark = [pytest.mark.django_db(transaction=True)]


def _context(model_dir: Path, payload: dict[str, Any], workdir: Path) -> StageContext:
    from contract.hardware import get_hardware

    return StageContext(model_dir=model_dir, config=json.loads((model_dir / "config.json").read_text()),
                        hardware=get_hardware("cpu").to_dict(), dtype="float32", purpose=payload["purpose"],
                        nonce=payload["nonce"], challenge=payload.get("challenge"),
                        reference_pool=payload.get("reference_pool"), bench=dict(payload.get("bench") or {}),
                        workdir=workdir, emit_fn=lambda *a, **k: None)


def _post(client: Any, job: Job, token: Any, stage: str, section: dict[str, Any]) -> dict[str, Any]:
    job.refresh_from_db()
    response = client.post(f"/api/v1/jobs/{job.pk}/results/", {"stage": stage, "section": section,
                                                                "attempt": job.attempts, "nonce": job.nonce},
                           format="json", **auth(token))
    assert response.status_code == 201, response.content
    return response.json()["stored"][0]


def _certify(api_client: Any, model: Any, hardware: Any, token: Any, model_dir: Path, workdir: Path,
             stages: tuple[str, ...] = ("load", "align", "serve", "eval")) -> dict[str, dict[str, Any]]:
    """A vendor's certify job run by the agent's stages on ``model_dir``: the portal's verdicts on its align and
    eval sections (those it ran: a failing stage stops the pipeline, as on an agent)."""
    job = JobFactory(model=model, hardware=hardware, state=JobState.QUEUED,
                     spec={"stages": list(stages), "dtype": "float32"})
    services.do_dispatch_job(job.pk)  # the portal draws this attempt's challenge
    job.refresh_from_db()
    services.do_transition_job(job, JobState.RUNNING)
    payload = dispatch.task_payload(Job.objects.get(pk=job.pk))
    assert "reference_pool" not in payload and payload["challenge"]["nonce"] == job.nonce
    ctx = _context(model_dir, payload, workdir)
    try:
        report = run_pipeline(ctx, list(stages))
    finally:
        server = ctx.state.server
        if server is not None:
            server.stop()
    sections = report["stages"]
    assert "align" not in stages or sections["align"]["e2e"]["raw"]["items"]
    assert "eval" not in stages or sections["eval"]["raw"]["mc"]
    return {stage: _post(api_client, job, token, stage, sections[stage]) for stage in ("align", "eval")
            if stage in stages}


def _reference_run(api_client: Any, model_dir: Path, tmp_path: Path, capture: Any) -> tuple[Any, Any]:
    """A release of ``model_dir``'s config whose reference run (staff-queued, on the reference hardware) has
    answered the whole pool with the agent's ``reference`` stage; returns (the release, a vendor's hardware)."""
    reference_hw = HardwareFactory(slug="ref-cpu")
    Hardware.objects.filter(pk=reference_hw.pk).update(reference=True)
    model = ModelReleaseFactory(config=json.loads((model_dir / "config.json").read_text()))
    staff = Client()
    staff.force_login(UserFactory(is_staff=True))
    with capture(execute=True):
        queued = staff.post(f"/api/v1/models/{model.slug}/reference/", {"model_path": str(model_dir)},
                            content_type="application/json")
    assert queued.status_code == 201, queued.content
    reference_job = Job.objects.get(pk=queued.json()["job"])
    services.do_transition_job(reference_job, JobState.RUNNING)
    payload = dispatch.task_payload(Job.objects.get(pk=reference_job.pk))
    report = run_pipeline(_context(model_dir, payload, tmp_path / "reference"), ["reference"])
    assert report["failed_stage"] is None, report["error"]
    reference_token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=reference_hw)
    _post(api_client, reference_job, reference_token, "reference", report["stages"]["reference"])
    assert ReferenceRun.objects.get(release=model).state == ReferenceState.FINISHED
    return model, HardwareFactory()


@pytest.mark.slow
def test_a_wrong_rope_theta_fails_align_by_the_portals_scores(api_client, sharp_llama, tmp_path,  # noqa: F811
                                                              django_capture_on_commit_callbacks) -> None:
    model, vendor_hw = _reference_run(api_client, sharp_llama, tmp_path, django_capture_on_commit_callbacks)
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=vendor_hw)
    faulty = _certify(api_client, model, vendor_hw, token, _target_with_rope(sharp_llama, tmp_path, 10.0),
                      tmp_path / "faulty")
    align = faulty["align"]
    assert align["verdict"] == "fail", align
    assert any("diverges" in r or "token match" in r for r in align["reasons"]), align["reasons"]
    stored = StageResult.objects.get(job__model=model, job__hardware=vendor_hw, stage="eval").challenge_scores
    assert stored["mc"]["agreement"] < 1  # the target picks other choices than the reference
    assert "e2e" in json.dumps(StageResult.objects.get(job__model=model, stage="align",
                                                       job__hardware=vendor_hw).challenge_scores)

    honest = _certify(api_client, model, vendor_hw, token, sharp_llama, tmp_path / "honest")
    assert honest["align"]["verdict"] == "pass", honest["align"]["reasons"]
    assert honest["eval"]["verdict"] == "pass", honest["eval"]["reasons"]


@pytest.mark.slow
@pytest.mark.timeout(3600)  # the real model's reference run answers the whole pool on CPU
def test_a_wrong_rope_theta_fails_the_real_models_align_and_eval(api_client, tmp_path,
                                                                 django_capture_on_commit_callbacks) -> None:
    from agents.runtime.testing.real_models import cached_real_model

    real = cached_real_model("smollm2-135m", "float32")
    model, vendor_hw = _reference_run(api_client, real, tmp_path, django_capture_on_commit_callbacks)
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=vendor_hw)
    wrong = _target_with_rope(real, tmp_path, 10.0)
    # the agent's own KV-cache check already fails its align under this fault, which stops that job there: eval runs
    # in a job of its own, as a vendor may submit it
    align = _certify(api_client, model, vendor_hw, token, wrong, tmp_path / "align", ("load", "align"))["align"]
    assert align["verdict"] == "fail", align
    assert any("diverges" in r or "token match" in r for r in align["reasons"]), align["reasons"]
    evaluation = _certify(api_client, model, vendor_hw, token, wrong, tmp_path / "eval", ("load", "serve", "eval"))
    assert evaluation["eval"]["verdict"] == "fail", evaluation["eval"]
    assert any("perplexity" in r or "accuracy" in r or "exact match" in r for r in evaluation["eval"]["reasons"]), \
        evaluation["eval"]["reasons"]
