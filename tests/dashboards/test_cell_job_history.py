"""A cell's job history tells the release's reference runs from the cell's certify jobs, and compares each job
only with the one before it of the same purpose."""

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
