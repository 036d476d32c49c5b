"""A cell is model × hardware × engine@version: each engine's evidence lands in its own cell, the matrix shows the
best engine's tier with the others listed, ``engine=`` filters the page, the API and the exports, a version
that regresses against the previous one fires the tier-drop alert, and the compare page says exactly which
version-lock entries differ between two engines' runs."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from apps.alerts.models import Subscription
from apps.alerts.receivers import do_alert_tier_drop
from apps.catalog.engines import default_engine, engine_for_spec, ensure_builtin_engines
from apps.catalog.models import Engine
from apps.core import events
from apps.jobs.choices import JobState
from apps.matrix.models import Cell, CellHistory
from apps.matrix.series import engine_cells
from tests.factories import HardwareFactory, ModelReleaseFactory
from tests.portal.engine_runs import run_job as _run
from tests.portal.engine_runs import spec as _spec
from tests.portal.engine_runs import vllm_serve as _vllm_serve
from tests.portal.reports import TIER_STAGES, failing, passing

pytestmark = pytest.mark.django_db


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_every_existing_cell_on_day0() -> None:
    model, hardware = ModelReleaseFactory(), HardwareFactory()
    Cell.objects.all().delete()
    executor = MigrationExecutor(connection)
    before, after = [("matrix", "0005_cell_history")], [("matrix", "0006_cell_engine")]
    try:
        executor.migrate(before)
        old = executor.loader.project_state([*before, ("catalog", "0007_engine")]).apps
        old.get_model("matrix", "Cell").objects.create(model_id=model.pk, hardware_id=hardware.pk, tier=4,
                                                       job_count=3)
        old.get_model("catalog", "Engine").objects.all().delete()  # even without its seeded row: day0 comes back
        executor = MigrationExecutor(connection)
        executor.migrate(after)
    finally:
        MigrationExecutor(connection).migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
    cell = Cell.objects.select_related("engine").get(model=model, hardware=hardware)
    assert (cell.engine.name, cell.engine.version, cell.engine.default, cell.tier, cell.job_count) == (
        "day0", "", True, 4, 3)


def test_two_engines_evidence_make_two_cells_and_the_matrix_shows_the_best(client, api_client) -> None:
    ensure_builtin_engines()
    model, hardware = ModelReleaseFactory(), HardwareFactory()
    _run(model, hardware, {s: passing(s) for s in TIER_STAGES[2]})  # day0: tier 2
    _run(model, hardware, {**{s: passing(s) for s in TIER_STAGES[2]}, "serve": _vllm_serve("0.32.0", "4")},
         _spec("vllm", "0.32.0"))  # vllm: tier 3
    cells = {c.engine.ref: c.tier for c in Cell.objects.filter(model=model, hardware=hardware)
             .select_related("engine")}
    assert cells == {"day0": 2, "vllm@0.32.0": 3}
    assert [e.ref for e in engine_cells(model.pk, hardware.pk)] == ["vllm@0.32.0", "day0"]  # best first

    html = client.get("/").content.decode()
    assert f'href="/cells/{model.slug}/{hardware.slug}/?engine=vllm%400.32.0"' in html
    assert 'data-engine="vllm@0.32.0"' in html and "vllm@0.32.0 +1" in html
    only_day0 = client.get("/?engine=day0").content.decode()
    assert f'href="/cells/{model.slug}/{hardware.slug}/"' in only_day0 and "vllm@0.32.0 +1" not in only_day0

    row = next(r for r in api_client.get("/api/v1/matrix/").json()["models"] if r["slug"] == model.slug)
    cell = row["cells"][hardware.slug]
    assert (cell["tier"], cell["engine"]) == (3, "vllm@0.32.0")
    assert cell["engines"] == [{"engine": "vllm@0.32.0", "tier": 3}, {"engine": "day0", "tier": 2}]
    for query, expected in (("engine=day0", ("day0", 2)), ("engine=vllm", ("vllm@0.32.0", 3)),
                            ("engine=vllm@0.32.0", ("vllm@0.32.0", 3))):
        row = next(r for r in api_client.get(f"/api/v1/matrix/?{query}").json()["models"] if r["slug"] == model.slug)
        assert (row["cells"][hardware.slug]["engine"], row["cells"][hardware.slug]["tier"]) == expected, query
    absent = next(r for r in api_client.get("/api/v1/matrix/?engine=sglang").json()["models"]
                  if r["slug"] == model.slug)
    assert absent["cells"][hardware.slug] is None  # no sglang cell: nothing to show
    bad = api_client.get("/api/v1/matrix/?engine=Bad Name")
    assert bad.status_code == 400 and "engine" in bad.json()

    rows = list(csv.DictReader(io.StringIO(client.get("/export/matrix.csv?engine=day0").content.decode())))
    mine = next(r for r in rows if r["model"] == model.slug and r["hardware"] == hardware.slug)
    assert (mine["engine"], mine["tier"]) == ("day0", "2")
    exported = json.loads(client.get("/export/matrix.json").content)["cells"]
    mine = next(r for r in exported if r["model"] == model.slug and r["hardware"] == hardware.slug)
    assert (mine["engine"], mine["engines"]) == ("vllm@0.32.0", "vllm@0.32.0:T3 day0:T2")

    detail = api_client.get(f"/api/v1/cells/{model.slug}/{hardware.slug}/").json()
    assert (detail["engine"], detail["tier"]) == ("day0", 2)  # the default engine's cell, as before engines
    assert [(e["engine"], e["tier"]) for e in detail["engines"]] == [("vllm@0.32.0", 3), ("day0", 2)]
    vllm = api_client.get(f"/api/v1/cells/{model.slug}/{hardware.slug}/?engine=vllm@0.32.0").json()
    assert (vllm["engine"], vllm["tier"]) == ("vllm@0.32.0", 3)
    assert vllm["evidence"]["stages"]["serve"]["section"]["engine"]["name"] == "vllm"
    assert "serve" not in detail["evidence"]["stages"]  # day0's evidence only: its job posted plan and load
    assert api_client.get(f"/api/v1/cells/{model.slug}/{hardware.slug}/?engine=nosuch").status_code == 400

    page = client.get(f"/cells/{model.slug}/{hardware.slug}/?engine=vllm@0.32.0").content.decode()
    assert 'id="cell-engines"' in page and 'data-engine="vllm@0.32.0"' in page
    assert "a=vllm%400.32.0&amp;b=day0" in page  # side by side with the other engine
    for url in (f"/models/{model.slug}/", f"/hardware/{hardware.slug}/"):
        listing = client.get(url).content.decode()
        assert "<th>engine</th>" in listing and "<code>vllm@0.32.0</code>" in listing and "<code>day0</code>" in listing


def test_a_version_that_regresses_fires_the_tier_drop_alert_once(django_capture_on_commit_callbacks) -> None:
    ensure_builtin_engines()
    Engine.objects.get_or_create(name="vllm", version="0.33.0", defaults={"executable": "vllm"})
    model, hardware = ModelReleaseFactory(), HardwareFactory()
    fired: list[dict[str, Any]] = []

    def listen(**facts: Any) -> None:
        fired.append(facts)

    events.tier_dropped.connect(listen, dispatch_uid="test.tier_dropped")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            _run(model, hardware, {**{s: passing(s) for s in TIER_STAGES[2]}, "serve": _vllm_serve("0.32.0", "4")},
                 _spec("vllm", "0.32.0"))
            _run(model, hardware, {**{s: passing(s) for s in TIER_STAGES[2]}, "serve": failing("serve")},
                 _spec("vllm", "0.33.0"), state=JobState.FAILED)
            # the same facts again (a re-judging, a late event): no second alert
            events.send_now(events.cell_inputs_changed, model_id=model.pk, hardware_id=hardware.pk, reason="",
                            history=None)
    finally:
        events.tier_dropped.disconnect(dispatch_uid="test.tier_dropped")
    across = [f for f in fired if f.get("previous_engine")]
    assert len(across) == 1, fired
    assert (across[0]["engine"], across[0]["previous_engine"], across[0]["from_tier"], across[0]["to_tier"]) == (
        "vllm@0.33.0", "vllm@0.32.0", 3, 2)
    assert across[0]["stages"] == {"serve": ["pass", "fail"]}
    newer = Cell.objects.get(model=model, hardware=hardware, engine__version="0.33.0")
    entry = CellHistory.objects.get(cell=newer, data__version_regression__against="vllm@0.32.0")
    assert "serve pass → fail" in entry.reason
    series = {e.ref: e for e in engine_cells(model.pk, hardware.pk)}
    assert series["vllm@0.33.0"].regressed and series["vllm@0.33.0"].previous == "vllm@0.32.0"

    Subscription.objects.create(organization=model.organization, name="hook", url="https://hooks.example.com/x",
                                kinds=["tier_drop"], format="json", secret="s3cret-key-0123456789")
    [delivery] = do_alert_tier_drop(**{k: v for k, v in across[0].items() if k not in ("signal", "sender")})
    assert delivery.event["summary"] == (f"{model.slug} on {hardware.slug}: vllm@0.33.0 regressed against "
                                         "vllm@0.32.0, tier 3 (serves) → 2 (loads): serve pass → fail")
    assert delivery.event["data"]["previous_engine"] == "vllm@0.32.0"


def test_the_compare_page_shows_two_engines_and_the_version_lock_diff(client) -> None:
    ensure_builtin_engines()
    model, hardware = ModelReleaseFactory(), HardwareFactory()
    env_a, env_b = passing("env"), passing("env")
    env_b["torch"] = "2.14.0"
    _run(model, hardware, {**{s: passing(s) for s in TIER_STAGES[3]}, "env": env_a, "eval": passing("eval")})
    worse = passing("eval")
    worse["tasks"][0]["target"] = 0.8
    _run(model, hardware, {**{s: passing(s) for s in TIER_STAGES[2]}, "serve": _vllm_serve("0.32.0", "8"),
                           "env": env_b, "eval": worse}, _spec("vllm", "0.32.0"))
    html = client.get(f"/compare/?model={model.slug}&hardware={hardware.slug}&a=day0&b=vllm@0.32.0").content.decode()
    assert 'id="compare-engines"' in html and "<code>vllm@0.32.0</code>" in html
    assert 'id="compare-lock"' in html and 'class="lock-differs"' in html
    differs = html.split('class="lock-differs"')[1].split("</p>")[0]
    for key in ("engine.name", "engine.command", "engine.env.OMP_NUM_THREADS", "package.torch"):
        assert f"<code>{key}</code>" in differs, key
    assert "package.python" not in differs  # the same on both runs: not named
    assert 'id="compare-eval"' in html and "▲" in html.split('id="compare-eval"')[1]  # arith 0.9 → 0.8
    missing = client.get(f"/compare/?model={model.slug}&hardware={hardware.slug}&a=day0&b=openai-compatible")
    assert missing.status_code == 400 and "has no run" in missing.content.decode()


def test_a_jobs_evidence_lands_in_the_requested_catalog_versions_cell() -> None:
    ensure_builtin_engines()
    assert engine_for_spec({}) == default_engine() == engine_for_spec({"engine": {"name": "day0"}})
    assert engine_for_spec(_spec("vllm", "0.32.0")).ref == "vllm@0.32.0"
    generic = engine_for_spec({"engine": {"name": "openai-compatible", "version": "1.4"}})
    assert generic.ref == "openai-compatible"  # the submitter's version is evidence, the catalog row the key


def test_an_engines_versions_share_one_benchmark_series_and_two_engines_never_do() -> None:
    from apps.accounts.access import Actor
    from apps.benchmarks.selectors import SeriesQuery, load_series

    ensure_builtin_engines()
    Engine.objects.get_or_create(name="vllm", version="0.33.0", defaults={"executable": "vllm"})
    model, hardware = ModelReleaseFactory(), HardwareFactory()
    _run(model, hardware, {"bench": passing("bench")})
    for version in ("0.32.0", "0.33.0"):
        _run(model, hardware, {"bench": passing("bench")}, _spec("vllm", version))
    series = load_series(Actor(is_staff=True), SeriesQuery(model=model.slug, hardware=hardware.slug,
                                                           metrics=("tpot_ms_p50",)))
    points = {s.config.engine: len(s.points) for s in series if s.config.concurrency == series[0].config.concurrency}
    assert points == {"": 1, "vllm": 2}
    assert any(s.config.label.endswith(" · vllm") for s in series)
