"""``/api/v1/benchmarks/`` and ``/api/v1/benchmarks/regressions/``: series, filters, CSV, flags, errors."""

from __future__ import annotations

import csv
import io
from datetime import timedelta

import pytest

from tests.factories import auth, make_token

pytestmark = pytest.mark.django_db


def series_url(world, **params: str) -> str:
    query = {"model": world.model.slug, "hardware": world.history_hardware.slug, **params}
    return "/api/v1/benchmarks/?" + "&".join(f"{k}={v}" for k, v in query.items())


def test_series_one_per_configuration_with_every_daily_run(world, client):
    body = client.get(series_url(world, metric="ttft_ms_p50")).json()
    assert body["count"] == 4  # concurrency 1, 4, 16, 64
    configs = sorted(s["config"]["concurrency"] for s in body["series"])
    assert configs == [1, 4, 16, 64]
    for s in body["series"]:
        assert s["metric"] == "ttft_ms_p50" and s["unit"] == "ms"
        assert len(s["points"]) == 31  # 30 daily runs and the adaptation job's benchmark
        times = [p["at"] for p in s["points"]]
        assert times == sorted(times)


def test_several_metrics_comma_separated_or_repeated(world, client):
    a = client.get(series_url(world, metric="ttft_ms_p99,output_tok_s")).json()
    b = client.get(series_url(world) + "&metric=ttft_ms_p99&metric=output_tok_s").json()
    assert a == b
    assert {s["metric"] for s in a["series"]} == {"ttft_ms_p99", "output_tok_s"}


def test_since_and_concurrency_narrow_the_points(world, client):
    since = (world.regression.at - timedelta(days=3)).date().isoformat()
    body = client.get(series_url(world, metric="tpot_ms_p50", since=since, concurrency="16")).json()
    assert body["count"] == 1
    points = body["series"][0]["points"]
    assert 5 <= len(points) <= 10 and all(p["at"] >= since for p in points)
    # the baseline still looks back before ``since``: the planted step is flagged
    assert [r["at"][:10] for r in body["series"][0]["regressions"]][0] == world.regression.at.date().isoformat()


def test_csv_export_of_a_series(world, client):
    response = client.get(series_url(world, metric="output_tok_s", format="csv"))
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert 'attachment; filename="benchmarks-' in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == 4 * 31
    assert set(rows[0]) >= {"model", "hardware", "dtype", "concurrency", "metric", "at", "value", "regression"}
    flagged = [r for r in rows if r["regression"] == "True"]
    assert flagged and all(r["at"][:10] >= world.regression.at.date().isoformat() for r in flagged)


def test_peak_memory_is_served_in_bytes_and_named_so(world, client):
    from apps.benchmarks.selectors import display_unit, display_value
    from apps.evidence.models import BenchmarkPoint

    body = client.get(series_url(world, metric="peak_memory_bytes", concurrency="4")).json()
    (series,) = body["series"]
    assert series["unit"] == "bytes"  # the values are bytes, not GiB
    stored = set(BenchmarkPoint.objects.filter(run__model=world.model, run__hardware=world.history_hardware,
                                               concurrency=4).values_list("peak_memory_bytes", flat=True))
    values = {p["value"] for p in series["points"]}
    assert values <= stored and min(values) > 2**30  # whole bytes of a model's weights and cache
    rows = list(csv.DictReader(io.StringIO(client.get(series_url(world, metric="peak_memory_bytes",
                                                                 format="csv")).content.decode())))
    assert rows and {r["unit"] for r in rows} == {"bytes"}
    # pages convert: GiB beside GiB values, a percentage of step time beside percentages
    assert display_unit("peak_memory_bytes") == "GiB" and display_value("peak_memory_bytes", 3 * 2**30) == 3
    assert display_unit("comm_overhead_ratio") == "% of step" and display_value("comm_overhead_ratio", 0.25) == 25
    assert display_unit("ttft_ms_p50") == "ms"


def test_regressions_list_the_planted_step_in_latency_and_throughput(world, client):
    body = client.get(f"/api/v1/benchmarks/regressions/?model={world.model.slug}").json()
    assert body["rule"]["lookback"] == 14 and body["rule"]["latency_ratio"] == 1.2
    assert body["count"] == len(body["results"]) > 0
    days = {r["at"][:10] for r in body["results"]}
    planted = world.regression.at.date()
    assert days <= {planted.isoformat(), (planted + timedelta(days=1)).isoformat()}
    metrics = {r["metric"] for r in body["results"] if r["at"][:10] == planted.isoformat()}
    assert {"ttft_ms_p50", "tpot_ms_p50", "output_tok_s"} <= metrics
    ttft = next(r for r in body["results"] if r["metric"] == "ttft_ms_p50")
    assert 1.35 < ttft["ratio"] < 1.9 and ttft["z"] >= 3 and ttft["direction"] == "lower_is_better"
    tput = next(r for r in body["results"] if r["metric"] == "output_tok_s")
    assert tput["ratio"] < 0.8 and tput["direction"] == "higher_is_better"
    assert all(r["hardware"] == world.history_hardware.slug for r in body["results"])


def test_rule_parameters_change_what_is_flagged(world, client):
    base = f"/api/v1/benchmarks/regressions/?model={world.model.slug}&metric=ttft_ms_p50"
    assert client.get(base).json()["count"] > 0
    assert client.get(base + "&latency_ratio=2.5").json()["count"] == 0
    assert client.get(base + "&z_threshold=1000").json()["count"] == 0


def test_regressions_as_csv(world, client):
    response = client.get(f"/api/v1/benchmarks/regressions/?model={world.model.slug}&format=csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert rows and {"metric", "at", "ratio", "z", "concurrency", "dtype", "job"} <= set(rows[0])


@pytest.mark.parametrize(
    ("query", "status", "key", "message"),
    [
        ("model=no-such-model", 404, "detail", "no model with slug 'no-such-model'"),
        ("hardware=nope", 404, "detail", "no hardware with slug 'nope'"),
        ("metric=watts", 400, "metric", "metric: unknown 'watts'"),
        ("since=last-week", 400, "since", "since must be an ISO date"),
        ("concurrency=many", 400, "concurrency", "concurrency must be an integer"),
        ("lookback=1", 400, "lookback", "lookback must be at least 2"),
        ("latency_ratio=abc", 400, "latency_ratio", "latency_ratio must be a number"),
        ("since=2026-05-01&until=2026-04-01", 400, "until", "until must not be before since"),
    ],
)
def test_bad_filters_are_answered_with_the_parameter_named(world, client, query, status, key, message):
    for path in ("/api/v1/benchmarks/", "/api/v1/benchmarks/regressions/"):
        response = client.get(f"{path}?{query}")
        assert response.status_code == status, (path, response.content)
        body = response.json()  # the API's one error shape: {"detail": ...} for 404, {param: [...]} for 400
        assert message in (body[key] if status == 404 else body[key][0])
    csv_error = client.get(f"/api/v1/benchmarks/?{query}&format=csv").content.decode()
    assert csv_error.startswith("error\n") and message in csv_error.replace('""', '"')


def test_an_embargoed_models_series_is_visible_to_its_organization_by_token(world, client):
    token = make_token(organization=world.secret_org, user=world.insider)
    body = client.get(f"/api/v1/benchmarks/?model={world.embargoed.slug}", **auth(token)).json()
    assert body["count"] > 0 and {s["model"] for s in body["series"]} == {world.embargoed.slug}
    other = make_token(organization=world.public_org, user=world.viewer)
    assert client.get(f"/api/v1/benchmarks/?model={world.embargoed.slug}", **auth(other)).status_code == 404
