"""The cell page once the portal holds references: the job history tells the release's reference runs from the
cell's certify jobs (each job compared only with the one before it of the same purpose), and an eval answered
with raw outputs only points to the portal's scores rather than saying there is no evaluation."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from apps.jobs.choices import JobPurpose, JobState
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory

pytestmark = pytest.mark.django_db


def test_a_certify_job_is_compared_with_the_certify_job_before_never_with_a_reference_run() -> None:
    model, hardware = ModelReleaseFactory(), HardwareFactory()
    jobs = [JobFactory(model=model, hardware=hardware, state=JobState.SUCCEEDED, purpose=purpose)
            for purpose in (JobPurpose.REFERENCE, JobPurpose.CERTIFY, JobPurpose.REFERENCE, JobPurpose.CERTIFY)]
    ref1, cert1, ref2, cert2 = (j.pk for j in jobs)
    for path in (f"/cells/{model.slug}/{hardware.slug}/", f"/jobs/?model={model.slug}"):
        html = Client().get(path).content.decode()
        pairs = set(re.findall(r'href="/compare/\?a=(\d+)&amp;b=(\d+)"', html))
        assert pairs == {(str(cert1), str(cert2)), (str(ref1), str(ref2))}, (path, pairs)
        rows = dict(re.findall(r'<tr data-job="(\d+)">(.*?)</tr>', html, re.S))
        assert all(("reference run" in rows[str(pk)]) == (pk in (ref1, ref2)) for pk in (ref1, cert1, ref2, cert2))


def test_an_eval_of_raw_outputs_only_points_to_the_portals_scores_not_to_no_evaluation() -> None:
    from apps.evidence.models import StageResult

    model, hardware = ModelReleaseFactory(), HardwareFactory()
    job = JobFactory(model=model, hardware=hardware, state=JobState.SUCCEEDED)
    path = f"/cells/{model.slug}/{hardware.slug}/"
    assert "No evaluation yet." in Client().get(path).content.decode()
    target = {"n": 20, "correct": 15, "accuracy": 0.75, "wilson_low": 0.53, "wilson_high": 0.89}
    StageResult.objects.create(job=job, stage="eval", passed=True, verdict="pass", attempt=1,
                               section={"raw": {"nonce": job.nonce}}, challenge_scores={
                                   "rtol": 0.05, "mc": {"target": target, "reference": target}})
    html = Client().get(path).content.decode()
    block = html[html.index('id="evaluation"'):]
    assert "No evaluation yet." not in html and 'id="eval-no-claims"' in block
    assert "the portal's scores are above" in block and "multiple choice (accuracy)" in html
