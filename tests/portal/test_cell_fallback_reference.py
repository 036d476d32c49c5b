"""A cell whose align section says the target ran the reference implementation (the transformers fallback in fp32
on the CPU) shows that instead of claiming an alignment; any other cell keeps its pass mark."""

from __future__ import annotations

import re

import pytest

from apps.evidence.services import do_record_stage_results
from tests.factories import JobFactory
from tests.portal.reports import passing

pytestmark = pytest.mark.django_db


def _alignment_card(client, job) -> str:  # noqa: ANN001
    response = client.get(f"/cells/{job.model.slug}/{job.hardware.slug}/")
    assert response.status_code == 200
    match = re.search(r'<section class="card" id="alignment".*?</section>', response.content.decode(), re.S)
    assert match
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", match.group(0)))


def test_the_cell_says_the_target_is_the_reference_instead_of_aligned(client) -> None:
    job = JobFactory(spec={"stages": ["align"], "dtype": "float32"})
    do_record_stage_results(job, {"align": {**passing("align"), "fallback_reference_identical": True}})
    card = _alignment_card(client, job)
    assert "= the reference itself" in card and "✓ passed" not in card
    assert "The target runs the reference implementation (transformers fallback)" in card


def test_an_ordinary_align_keeps_its_pass_mark(client) -> None:
    job = JobFactory(spec={"stages": ["align"], "dtype": "float32"})
    do_record_stage_results(job, {"align": passing("align")})
    card = _alignment_card(client, job)
    assert "✓ passed" in card and "reference itself" not in card
