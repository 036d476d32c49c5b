"""Seeded evidence goes through the portal's verdicts like an agent's, carries historic times from an explicit
clock, and is marked synthetic in the API, on the cell page and in the exports."""

from __future__ import annotations

import ast
import csv
import io
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from apps.benchmarks.seeding import seed_evidence
from apps.evidence.manifests import digest_disagreement
from apps.evidence.models import StageResult
from apps.matrix.models import Cell
from tests.factories import HardwareFactory, ModelReleaseFactory

pytestmark = pytest.mark.django_db
NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def seeded() -> tuple:
    model = ModelReleaseFactory(slug="seeded-1b", released_at=NOW - timedelta(days=30))
    good, bad = HardwareFactory(slug="seed-good"), HardwareFactory(slug="seed-bad")
    seed_evidence(models=[model], hardware=[good, bad], days=3, history_cells=1, hardware_per_model=2, seed=3,
                  now=NOW, outcomes=["validated", "align-fails"])
    return model, good, bad


def test_seeded_cells_are_judged_by_the_portal_and_stamped_by_the_clock(seeded) -> None:
    model, good, bad = seeded
    validated, failed = Cell.objects.get(model=model, hardware=good), Cell.objects.get(model=model, hardware=bad)
    assert validated.tier == 6 and validated.synthetic and validated.disputed == []
    assert (failed.tier, failed.failed_stage) == (2, "align")
    assert failed.verdicts["align"]["status"] == "fail"
    assert not StageResult.objects.filter(job__model=model, job__hardware=bad, stage="serve").exists()  # none ran
    assert any("layer" in r and "cosine" in r for r in failed.verdicts["align"]["reasons"])
    times = [datetime.fromisoformat(validated.tier_reached_at[str(t)]) for t in range(1, 7)]
    assert times == sorted(times) and model.released_at - timedelta(hours=7) < times[0] < NOW - timedelta(days=3)
    results = StageResult.objects.filter(job__model=model)
    assert results.exists() and all(r.synthetic for r in results)
    assert all(r.created_at < NOW for r in results)  # the clock's time, not the time the test ran
    # a vendor's load never records the manifest; the two hardware loaded the same digests: no disagreement
    model.refresh_from_db()
    assert model.manifest_source == "" and model.manifest == [] and digest_disagreement(model) is None


def test_synthetic_is_marked_in_the_api_the_cell_page_and_the_exports(seeded, api_client, client) -> None:
    model, good, _ = seeded
    detail = api_client.get(f"/api/v1/cells/{model.slug}/{good.slug}/").json()
    assert detail["synthetic"] is True and detail["verdicts"]["bench"]["synthetic"] is True
    assert all(stage["synthetic"] for stage in detail["evidence"]["stages"].values())
    assert all(run["synthetic"] for run in detail["evidence"]["benchmarks"])
    row = next(r for r in api_client.get("/api/v1/matrix/").json()["models"] if r["slug"] == model.slug)
    assert row["cells"][good.slug]["synthetic"] is True
    page = client.get(f"/cells/{model.slug}/{good.slug}/").content.decode()
    assert 'id="mark-synthetic"' in page and "synthetic evidence" in page
    assert 'data-stage="align" data-verdict="pass"' in page
    matrix_csv = list(csv.DictReader(io.StringIO(client.get("/export/matrix.csv").content.decode())))
    cell_row = next(r for r in matrix_csv if r["model"] == model.slug and r["hardware"] == good.slug)
    assert cell_row["synthetic"] == "True"
    bench_csv = api_client.get("/api/v1/benchmarks/", {"model": model.slug, "hardware": good.slug,
                                                       "metric": "ttft_ms_p50", "format": "csv"})
    rows = list(csv.DictReader(io.StringIO(bench_csv.content.decode())))
    assert rows and all(r["synthetic"] == "True" for r in rows)


def test_no_test_library_is_imported_by_app_code() -> None:
    banned = {"factory", "faker", "unittest", "pytest", "freezegun"}
    offenders = []
    for path in [*ROOT.glob("apps/**/*.py"), *ROOT.glob("day0portal/**/*.py"), *ROOT.glob("agents/**/*.py"),
                 *ROOT.glob("day0cli/**/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in banned]
    assert offenders == []


def test_seeded_benchmarks_of_the_whole_catalog_pass_the_physics_rules() -> None:
    """Every seeded bench section, on every catalog model and hardware (real configs and bandwidths), is
    physically plausible: the portal's own bench verdict passes it, so seeded history feeds the baselines."""
    from apps.catalog.models import Hardware, ModelRelease
    from apps.catalog.seed import seed_catalog

    seed_catalog(include_cpu=False)
    # dense at two sizes, MoE, MLA with fp8, mxfp4: each on the fastest, a large and the slowest memory
    slugs = ("llama-3.1-8b", "llama-3.1-405b", "qwen3-30b-a3b", "deepseek-v3", "gpt-oss-120b")
    models = list(ModelRelease.objects.filter(slug__in=slugs).exclude(released_at=None))
    hardware = list(Hardware.objects.filter(slug__in=("nvidia-b200", "amd-mi300x", "huawei-ascend-910b")))
    seed_evidence(models=models, hardware=hardware, days=0, history_cells=0, seed=5, now=NOW,
                  outcomes=["baselined"] * len(hardware))
    results = StageResult.objects.filter(stage="bench")
    assert results.count() >= 12  # (a cell whose model does not fit stops at the plan)
    failed = {(r.job.model.slug, r.job.hardware.slug): r.reasons for r in results.exclude(verdict="pass")}
    assert failed == {}
