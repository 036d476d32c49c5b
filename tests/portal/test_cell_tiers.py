"""The cell's tier is computed from the newest evidence of each stage (docs/stage-report.md, the tiers), never set by hand."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from unittest import mock

import pytest
from django.utils import timezone

from apps.evidence.ingest import do_record_job_results
from apps.jobs.choices import JobState
from apps.jobs.services import do_transition_job
from apps.matrix.models import Cell
from apps.matrix.services import tier_times
from contract.tiers import compute_tier
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory
from tests.portal.challenges import answer, answered
from tests.portal.reports import TIER_STAGES, bound, failing, passing

pytestmark = pytest.mark.django_db


@pytest.fixture
def cell_pair() -> tuple:
    return ModelReleaseFactory(), HardwareFactory()


def _cell(model, hardware) -> Cell:
    return Cell.objects.get(model=model, hardware=hardware)


def test_a_new_model_has_an_untested_cell_with_a_fits_estimate(cell_pair) -> None:
    model, hardware = cell_pair
    cell = _cell(model, hardware)
    assert cell.tier == 0 and cell.tier_name == "untested"
    assert cell.fits is True and cell.fits_devices == 1  # a ~1.1B model on one 80 GB device
    assert cell.fits_plan["plan"]["tp"] == 1


@pytest.mark.parametrize("tier", sorted(TIER_STAGES))
def test_each_tier_is_reached_by_passing_its_gate_and_all_below(cell_pair, tier: int) -> None:
    model, hardware = cell_pair
    job = JobFactory(model=model, hardware=hardware)
    do_record_job_results(job, bound(job, {"stages": answered(job, {s: passing(s) for s in TIER_STAGES[tier]})}))
    cell = _cell(model, hardware)
    assert cell.tier == tier
    assert set(cell.tier_reached_at) == {str(t) for t in range(1, tier + 1)}
    assert cell.current_tier_reached_at is not None


@pytest.mark.parametrize("stage", ["plan", "load", "serve", "align", "bench", "eval"])
def test_a_failing_gate_stops_the_tier_below_it(cell_pair, stage: str) -> None:
    model, hardware = cell_pair
    job = JobFactory(model=model, hardware=hardware)
    stages = TIER_STAGES[6]
    index = stages.index(stage)
    sections = {s: passing(s) for s in stages}
    sections[stage] = failing(stage)
    do_record_job_results(job, bound(job, {"stages": answered(job, sections)}))
    assert _cell(model, hardware).tier == index  # the tier reached before the failing gate


def test_a_passing_gate_above_a_missing_one_does_not_count(cell_pair) -> None:
    model, hardware = cell_pair
    job = JobFactory(model=model, hardware=hardware)
    do_record_job_results(job, bound(job, {"stages": {"plan": passing("plan"), "serve": passing("serve")}}))
    assert _cell(model, hardware).tier == 1


def test_kv_cache_drift_fails_alignment_whatever_its_flag_says(cell_pair) -> None:
    model, hardware = cell_pair
    job = JobFactory(model=model, hardware=hardware)
    align = passing("align")
    align["kv_cache"]["max_abs_err"] = 0.02  # above the default 1e-4; the agent still says passed
    do_record_job_results(job, bound(job, {"stages": {"plan": passing("plan"), "load": passing("load"),
                                           "serve": passing("serve"), "align": align}}))
    cell = _cell(model, hardware)
    assert cell.tier == 3 and cell.failed_stage == "align"
    assert "kv_cache max_abs_err 0.02 is above 0.0001" in cell.error
    assert cell.disputed == ["align"] and cell.verdicts["align"]["claimed"] is True


GATES = ["plan", "load", "serve", "align", "bench", "eval"]
ORDERS = list(itertools.permutations(GATES))


def test_tier_time_rule_is_monotone_for_all_720_orders_of_stage_arrival() -> None:
    """The rule ``recompute_cell`` applies after each arrival, run for every order of the six gates."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    for order in ORDERS:
        times: dict[str, datetime] = {}
        reached: dict[str, str] = {}
        for i, stage in enumerate(order):
            times[stage] = now = start + timedelta(minutes=i)
            reached = tier_times(reached, compute_tier({s: True for s in times}), times, now)
        got = [datetime.fromisoformat(reached[str(t)]) for t in range(1, 7)]
        assert got == sorted(got), order
        for level in range(1, len(GATES) + 1):  # no earlier than its gate's evidence and every gate below
            assert got[level - 1] >= max(times[s] for s in GATES[:level])


@pytest.mark.parametrize("order", [pytest.param(order, marks=[] if i % 97 == 0 else [pytest.mark.slow])
                                   for i, order in enumerate(ORDERS)])
def test_tier_times_are_monotone_for_every_order_of_stage_arrival(cell_pair, order: tuple[str, ...]) -> None:
    """Through the ingest service: a sample of orders by default, all 720 under ``-m slow``."""
    model, hardware = cell_pair
    job = JobFactory(model=model, hardware=hardware)
    start = timezone.now()
    for i, stage in enumerate(order):  # each stage's evidence arrives one minute after the previous one
        with mock.patch.object(timezone, "now", return_value=start + timedelta(minutes=i)):
            do_record_job_results(job, bound(job, {"stage": stage, "section": answer(job, stage, passing(stage))}))
    cell = _cell(model, hardware)
    assert cell.tier == 6
    times = [datetime.fromisoformat(cell.tier_reached_at[str(t)]) for t in range(1, 7)]
    assert times == sorted(times), (order, times)
    # a tier is reached no earlier than the evidence of its own gate and of every gate below it
    gate_times = {stage: start + timedelta(minutes=order.index(stage)) for stage in order}
    for level, stage in enumerate(["plan", "load", "serve", "align", "bench", "eval"], 1):
        assert times[level - 1] >= gate_times[stage]
    assert cell.current_tier_reached_at == times[-1] == max(gate_times.values())


def test_newest_evidence_of_a_stage_wins_and_a_drop_clears_the_times_above(cell_pair) -> None:
    model, hardware = cell_pair
    first = JobFactory(model=model, hardware=hardware)
    do_record_job_results(first, bound(first, {"stages": {s: passing(s) for s in TIER_STAGES[3]}}))
    reached = dict(_cell(model, hardware).tier_reached_at)
    second = JobFactory(model=model, hardware=hardware)
    do_record_job_results(second, bound(second, {"stage": "load", "section": failing("load")}))
    cell = _cell(model, hardware)
    assert cell.tier == 1  # the newest load evidence fails
    assert cell.tier_reached_at == {"1": reached["1"]}  # tier 1's first time stays; 2 and 3 are no longer reached
    third = JobFactory(model=model, hardware=hardware)
    do_record_job_results(third, bound(third, {"stage": "load", "section": passing("load")}))
    cell = _cell(model, hardware)
    assert cell.tier == 3 and cell.tier_reached_at["1"] == reached["1"]
    assert cell.tier_reached_at["2"] > reached["2"] and cell.tier_reached_at["3"] > reached["3"]  # reached anew
    history = [(h.tier_before, h.tier_after) for h in cell.history.order_by("at", "id")]
    assert history == [(0, 3), (3, 1), (1, 3)]
    assert f"results of job {third.pk}" in cell.history.order_by("-at", "-id").first().reason


def test_a_failed_job_shows_failed_at_its_stage_over_the_tier_reached(cell_pair) -> None:
    model, hardware = cell_pair
    job = JobFactory(model=model, hardware=hardware)
    do_record_job_results(job, bound(job, {"stages": {"plan": passing("plan"), "load": passing("load")}}))
    do_transition_job(job, JobState.FAILED, failed_stage="serve", error="server did not become ready in 120 s")
    cell = _cell(model, hardware)
    assert (cell.tier, cell.failed_stage) == (2, "serve")
    assert "ready" in cell.error
    retry = JobFactory(model=model, hardware=hardware, state=JobState.RUNNING)
    do_record_job_results(retry, bound(retry, {"stage": "serve", "section": passing("serve")}))
    do_transition_job(retry, JobState.SUCCEEDED)
    cell = _cell(model, hardware)
    assert (cell.tier, cell.failed_stage, cell.error) == (3, "", "")


def test_a_lost_job_is_shown_as_lost(cell_pair) -> None:
    model, hardware = cell_pair
    job = JobFactory(model=model, hardware=hardware)
    do_transition_job(job, JobState.LOST, error="no heartbeat for 300 s")
    assert _cell(model, hardware).failed_stage == "lost"


def test_lead_time_is_reached_minus_release(cell_pair, api_client) -> None:
    model, hardware = cell_pair
    model.released_at = timezone.now() - timedelta(hours=30)
    model.save()
    job = JobFactory(model=model, hardware=hardware)
    do_record_job_results(job, bound(job, {"stage": "plan", "section": passing("plan")}))
    body = api_client.get(f"/api/v1/cells/{model.slug}/{hardware.slug}/").json()
    assert body["tier_name"] == "planned"
    assert body["lead_time_hours"]["planned"] == pytest.approx(30.0, abs=0.2)
    matrix = api_client.get("/api/v1/matrix/").json()
    row = next(r for r in matrix["models"] if r["slug"] == model.slug)
    assert row["cells"][hardware.slug]["lead_time_hours"] == pytest.approx(30.0, abs=0.2)


def test_changing_the_release_time_moves_the_lead_time(cell_pair, api_client) -> None:
    from apps.catalog.services import do_update_model_release

    model, hardware = cell_pair
    job = JobFactory(model=model, hardware=hardware)
    do_record_job_results(job, bound(job, {"stage": "plan", "section": passing("plan")}))
    reached = _cell(model, hardware).current_tier_reached_at
    do_update_model_release(model, released_at=reached - timedelta(hours=5))
    assert _cell(model, hardware).lead_hours == pytest.approx(5.0)
    do_update_model_release(model, released_at=reached + timedelta(hours=2))  # tested before release (embargo)
    assert _cell(model, hardware).lead_hours == pytest.approx(-2.0)


# (what the newer job does, whether "failed at align" clears)
PROVING = [
    ("passes another stage only", {"plan": "pass"}, True),
    ("fails align again", {"align": "fail"}, True),
    ("passes align", {"align": "pass"}, False),
]


@pytest.mark.parametrize(("case", "newer", "still_failed"), PROVING, ids=[p[0] for p in PROVING])
def test_failed_at_clears_only_when_a_newer_job_proves_the_failed_stage(cell_pair, case, newer, still_failed) -> None:
    model, hardware = cell_pair
    job = JobFactory(model=model, hardware=hardware)
    do_record_job_results(job, bound(job, {"stages": {s: passing(s) for s in TIER_STAGES[3]}}))
    do_transition_job(job, JobState.FAILED, failed_stage="align", error="layer 3 cosine 0.91")
    assert _cell(model, hardware).failed_stage == "align"
    later = JobFactory(model=model, hardware=hardware)
    sections = {stage: passing(stage) if verdict == "pass" else failing(stage) for stage, verdict in newer.items()}
    do_record_job_results(later, bound(later, {"stages": answered(later, sections)}))
    failed = next((stage for stage, verdict in newer.items() if verdict != "pass"), None)
    do_transition_job(later, JobState.FAILED if failed else JobState.SUCCEEDED, failed_stage=failed)
    cell = _cell(model, hardware)
    if still_failed:
        assert cell.failed_stage == "align", case
    else:
        assert (cell.failed_stage, cell.error, cell.tier) == ("", "", 4)


def test_a_cancelled_job_shows_until_a_newer_job_proves_what_it_did_not_run(cell_pair) -> None:
    model, hardware = cell_pair
    job = JobFactory(model=model, hardware=hardware, spec={"stages": ["plan", "load", "serve"]})
    do_record_job_results(job, bound(job, {"stage": "plan", "section": passing("plan")}))
    do_transition_job(job, JobState.CANCELLED, error="cancelled by user")
    cell = _cell(model, hardware)
    assert (cell.failed_stage, cell.error) == ("cancelled", "cancelled by user")
    later = JobFactory(model=model, hardware=hardware, spec={"stages": ["plan", "load"]})
    do_record_job_results(later, bound(later, {"stages": {"plan": passing("plan"), "load": passing("load")}}))
    do_transition_job(later, JobState.SUCCEEDED)
    assert _cell(model, hardware).failed_stage == "cancelled"  # serve, never run, is not proved yet
    last = JobFactory(model=model, hardware=hardware, spec={"stages": ["serve"]})
    do_record_job_results(last, bound(last, {"stage": "serve", "section": passing("serve")}))
    do_transition_job(last, JobState.SUCCEEDED)
    assert (_cell(model, hardware).failed_stage, _cell(model, hardware).tier) == ("", 3)
