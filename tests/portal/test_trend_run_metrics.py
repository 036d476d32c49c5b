"""The per-run numbers of multi-device and MoE bench runs as benchmark trend series: communication overhead
(rank 0 and the slowest rank), TPOT jitter and MoE expert imbalance, read from each bench run's section, flagged like the other series
and shown on /trends/ beside them with the hardware's stack changes marked; the API serves them too."""

from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.utils import timezone

from apps.accounts.access import Actor
from apps.benchmarks.run_metrics import run_metric
from apps.benchmarks.selectors import SeriesQuery, load_series
from apps.evidence.models import BenchmarkRun
from apps.evidence.services import do_record_stage_results
from apps.fleet.models import StackChange
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory
from tests.portal.reports import passing

pytestmark = pytest.mark.django_db
RUNS = 8  # the newest run's communication overhead jumps 2x: past the detector's 5 runs of history


def _history(moe: bool = True):  # noqa: ANN202
    model, hardware = ModelReleaseFactory(), HardwareFactory()
    start = timezone.now() - timedelta(days=RUNS)
    for day in range(RUNS):
        section = passing("bench")
        for run in section["runs"]:
            run.update({"comm_overhead_ratio": (0.10 if day == RUNS - 1 else 0.05) + 0.0005 * (day % 3),
                        "comm_overhead_ratio_per_rank": [0.05, 0.07], "comm_overhead_ratio_max": 0.07,
                        "tpot_jitter": 1.5 + 0.01 * (day % 2)})
            if moe:
                run["expert_balance"] = {"max_over_mean": 1.3, "ep_size": 2, "ep_max_over_mean": 1.05,
                                         "tokens_per_expert": [3, 1], "tokens_per_ep_rank": [3, 1]}
        job = JobFactory(model=model, hardware=hardware, spec={"stages": ["bench"], "dtype": "bfloat16"})
        [result] = do_record_stage_results(job, {"bench": section})
        BenchmarkRun.objects.filter(result=result).update(created_at=start + timedelta(days=day))
    return model, hardware, start


def test_the_run_metrics_read_each_runs_keys_and_jitter_from_the_percentiles_of_older_runs() -> None:
    old = passing("bench")["runs"][0]
    assert run_metric(old, "tpot_jitter") == pytest.approx(15.0 / 9.5)
    assert run_metric(old, "comm_overhead_ratio") is None and run_metric(old, "expert_max_over_mean") is None
    one_rank = {"expert_balance": {"max_over_mean": 1.2, "ep_size": 1, "ep_max_over_mean": 1.0}}
    assert run_metric(one_rank, "expert_max_over_mean") == 1.2 and run_metric(one_rank, "expert_ep_max_over_mean") is None
    with pytest.raises(ValueError, match="unknown run metric 'ttft'"):
        run_metric(old, "ttft")


def test_comm_overhead_jitter_and_expert_imbalance_are_series_and_a_jump_is_flagged() -> None:
    model, hardware, _ = _history()
    query = SeriesQuery(model=model.slug, hardware=hardware.slug,
                        metrics=("comm_overhead_ratio", "comm_overhead_ratio_max", "tpot_jitter",
                                 "expert_max_over_mean", "expert_ep_max_over_mean", "output_tok_s"))
    series = load_series(Actor(is_staff=True), query)
    by_metric: dict[str, list] = {}
    for s in series:
        by_metric.setdefault(s.metric, []).append(s)
    assert sorted(by_metric) == sorted(query.metrics)
    assert [s.config.concurrency for s in by_metric["comm_overhead_ratio"]] == [1, 4, 16]
    assert all(len(s.points) == RUNS for s in series)
    flagged = {(s.metric, s.config.concurrency) for s in series if s.regressions}
    assert flagged == {("comm_overhead_ratio", c) for c in (1, 4, 16)}, flagged  # the jump, nothing else
    one = load_series(Actor(is_staff=True), SeriesQuery(model=model.slug, hardware=hardware.slug,
                                                        metrics=("tpot_jitter",), concurrency=4))
    assert [s.config.concurrency for s in one] == [4] and one[0].points[-1].value == pytest.approx(1.51)


def test_the_trends_page_charts_them_beside_the_others_with_stack_changes_marked(client) -> None:
    model, hardware, start = _history()
    change = StackChange.objects.create(hardware=hardware, before={"torch": "2.12.0"}, after={"torch": "2.13.0"},
                                        changed=["torch"])
    StackChange.objects.filter(pk=change.pk).update(created_at=start + timedelta(days=3, hours=1))
    html = client.get(f"/trends/?model={model.slug}&hardware={hardware.slug}").content.decode()
    for family in ("ttft_ms", "output_tok_s", "comm_overhead_ratio", "comm_overhead_ratio_max", "tpot_jitter",
                   "expert_max_over_mean", "expert_ep_max_over_mean"):
        assert f'id="trend-{family}-card"' in html, family
    data = json.loads(re.search(r'<script id="trend-comm_overhead_ratio-data" type="application/json">(.*?)</script>',
                                html, re.S).group(1))
    assert [line["label"] for line in data["series"]] == ["c=1", "c=4", "c=16"]
    assert data["series"][0]["points"][0][1] == pytest.approx(5.0) and data["floor"] == 0  # percent of step time
    assert len(data["series"][0]["regressions"]) == 1
    assert [m["label"] for m in data["stack_changes"]] == ["torch 2.13.0"]
    assert 'data-metric="comm_overhead_ratio" data-flagged="3"' in html
    api = client.get(f"/api/v1/benchmarks/?model={model.slug}&hardware={hardware.slug}&metric=tpot_jitter").json()
    assert api["count"] == 3 and {s["metric"] for s in api["series"]} == {"tpot_jitter"}
    assert [c["changed"] for c in api["stack_changes"]] == [["torch"]]
    bad = client.get(f"/api/v1/benchmarks/?model={model.slug}&metric=jitter")
    assert bad.status_code == 400 and "tpot_jitter" in bad.content.decode()


def test_a_dense_one_device_history_hides_the_charts_it_has_no_numbers_for(client) -> None:
    model, hardware = ModelReleaseFactory(), HardwareFactory()
    job = JobFactory(model=model, hardware=hardware, spec={"stages": ["bench"], "dtype": "bfloat16"})
    section = passing("bench")
    for run in section["runs"]:  # what a one-rank server reports: no time in collectives
        run.update({"comm_overhead_ratio": 0.0, "comm_overhead_ratio_per_rank": [0.0], "comm_overhead_ratio_max": 0.0})
    do_record_stage_results(job, {"bench": section})
    html = client.get(f"/trends/?model={model.slug}&hardware={hardware.slug}").content.decode()
    assert 'id="trend-tpot_jitter-card"' in html  # from the TPOT percentiles
    assert 'id="trend-comm_overhead_ratio-card"' not in html and 'id="trend-expert_max_over_mean-card"' not in html
    absent = re.search(r'id="trends-absent">(.*?)</p>', html, re.S).group(1)
    assert "Communication overhead (rank 0)" in absent and "Expert imbalance" in absent


def test_the_regressions_page_shows_a_comm_overhead_jump_as_a_percentage_of_step_time(client) -> None:
    model, _, _ = _history(moe=False)
    html = client.get(f"/regressions/?model={model.slug}&metric=comm_overhead_ratio").content.decode()
    cells = re.findall(r'data-label="value / baseline">([\d.]+) / ([\d.]+) ([^<(]+?)\s*(?:<|$)', html)
    assert cells, html[-2000:]
    for value, baseline, unit in cells:  # 0.1005 of step time against a median of about 0.05: in percent
        assert unit == "% of step" and 9.5 < float(value) < 10.5 and 4.5 < float(baseline) < 5.5, cells
