"""A soak section is stored as evidence and judged by the portal from its numbers (not its own flag)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from apps.evidence.models import StageResult
from apps.evidence.services import do_record_stage_results
from tests.factories import JobFactory

pytestmark = pytest.mark.django_db

SOAK = {"seconds": 60.0, "passed": True, "memory_slope": 1200.0, "crashes": 0, "recover_seconds": 8.5,
        "windows": [{"t": 10.0, "output_tok_s": 50.0, "rss_bytes": 900_000_000, "outage": False},
                    {"t": 20.0, "output_tok_s": 0.0, "rss_bytes": None, "outage": True},
                    {"t": 30.0, "output_tok_s": 49.0, "rss_bytes": 905_000_000, "outage": False}]}


def _job():
    return JobFactory(spec={"stages": ["serve", "soak"], "dtype": "bfloat16"})


def test_a_steady_soak_passes_and_a_crash_or_a_slowdown_fails_whatever_it_claims() -> None:
    [ok] = do_record_stage_results(_job(), {"soak": SOAK})
    assert ok.verdict == "pass" and StageResult.objects.get(pk=ok.pk).section["recover_seconds"] == 8.5
    slow = {**SOAK, "windows": [SOAK["windows"][0], {**SOAK["windows"][2], "output_tok_s": 40.0}]}
    for bad, words in (({"crashes": 2}, "crash"), (slow, "throughput"), ({"recover_seconds": None}, "recover"),
                       ({"memory_slope": 8e6}, "memory grows")):
        [result] = do_record_stage_results(_job(), {"soak": {**SOAK, **bad}})
        assert result.verdict == "fail" and any(words in r for r in result.reasons), result.reasons


def test_a_malformed_soak_section_is_refused_naming_the_path() -> None:
    for bad, where in (({"windows": "x"}, "stages.soak.windows"), ({"crashes": -1}, "stages.soak"),
                       ({"windows": [{"t": "soon"}]}, "stages.soak.windows[0]")):
        with pytest.raises(ValidationError) as err:
            do_record_stage_results(_job(), {"soak": {**SOAK, **bad}})
        assert where in str(err.value), err.value
    assert StageResult.objects.count() == 0


def test_the_cell_page_shows_soak_throughput_and_memory_over_time(client) -> None:
    job = _job()
    do_record_stage_results(job, {"soak": SOAK})
    page = client.get(f"/cells/{job.model.slug}/{job.hardware.slug}/").content.decode()
    assert 'id="soak"' in page and "recovered from the injected kill in 8.5 s" in page
    assert page.count("<polyline") == 2 and "max 863 MiB" in page
