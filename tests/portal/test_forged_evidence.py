"""Forged or broken results posted through the REST API with an agent token: the portal judges the numbers
itself, so none raises a tier, each refusal names what was wrong, and the agent's flags are kept as claims.
Thresholds outside their range are refused when the job is submitted."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from apps.catalog.models import ModelRelease
from apps.evidence.models import StageResult
from apps.matrix.models import Cell
from tests.endpoint_sections import endpoint_align
from tests.factories import JobFactory, auth, make_token
from tests.portal.challenges import answer
from tests.portal.forger import agent_cell, climb_to, post_result
from tests.portal.reports import PASSING, new_attempt, passing

pytestmark = pytest.mark.django_db

GATE_TIER = {"plan": 1, "load": 2, "serve": 3, "align": 4, "bench": 5, "eval": 6}


def _align_without(part: str) -> dict[str, Any]:
    section = passing("align")
    del section[part]
    return section


def _patched(stage: str, patch: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    section = passing(stage)
    patch(section)
    return section


def _bench_runs(**changes: Any) -> Callable[[dict[str, Any]], None]:
    def patch(section: dict[str, Any]) -> None:
        for run in section["runs"]:
            run.update(copy.deepcopy(changes))
    return patch


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def patch(section: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = section
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = value
    return patch


# (case, stage, forged section, verdict, a phrase the reason must contain)
FORGED: list[tuple[str, str, dict[str, Any], str, str]] = [
    ("align flag only", "align", {"passed": True}, "incomplete", "align: ops missing"),
    ("align without ops", "align", _align_without("ops"), "incomplete", "align: ops missing"),
    ("align without layers", "align", _align_without("layers"), "incomplete", "align: layers missing"),
    ("align without e2e", "align", _align_without("e2e"), "incomplete", "align: e2e: raw outputs missing"),
    ("align without kv_cache", "align", _align_without("kv_cache"), "incomplete", "align: kv_cache missing"),
    ("align empty ops", "align", _patched("align", _set("ops", [])), "incomplete", "align: ops missing"),
    ("pass flags over a failing layer", "align", _patched("align", _set("layers.17.cosine", 0.93)), "fail",
     "layer 17 cosine 0.93 is below 0.99"),
    ("pass flags over a failing operator", "align", _patched("align", _set("ops.0.max_rel_err", 0.5)), "fail",
     "op matmul max_rel_err 0.5 is above 0.01"),
    # the agent's own e2e numbers and eval scores are claims: the portal scores raw outputs (test_references.py)
    ("too few layers compared", "align", _patched("align", _set("layers", PASSING["align"]["layers"][:3])), "fail",
     "layers: 3 compared, the model has 22"),
    ("the issue's bench: 99 failed requests", "bench",
     {**passing("bench"), "runs": [{**PASSING["bench"]["runs"][0], "failed": 99, "completed": 1}]}, "fail",
     "run at concurrency 1 has 99 of 100 failed requests"),
    ("one concurrency level", "bench", {**passing("bench"), "runs": [PASSING["bench"]["runs"][0]]}, "fail",
     "1 concurrency level(s), a baseline sweeps at least 3"),
    ("failed requests at every level", "bench", _patched("bench", _bench_runs(failed=2)), "fail",
     "run at concurrency 4 has 2 of 34 failed requests"),
    ("percentiles out of order", "bench",
     _patched("bench", _bench_runs(itl_ms={"mean": 10.0, "p50": 30.0, "p90": 12.0, "p99": 15.0})), "fail",
     "itl_ms percentiles are not ordered"),
    ("TPOT above end to end", "bench",
     _patched("bench", _bench_runs(tpot_ms={"mean": 1000.0, "p50": 990.0, "p90": 1000.0, "p99": 1001.0})), "fail",
     "run at concurrency 1: TPOT mean 1000 ms exceeds end-to-end mean 650 ms"),
    ("bench without latency", "bench", _patched("bench", _bench_runs(e2e_ms=None)), "incomplete",
     "run at concurrency 1: e2e_ms missing"),
    ("load with problems", "load",
     _patched("load", _set("problems", [{"tensor": "lm_head.weight", "problem": "12 NaN values"}])), "fail",
     "1 problem(s), first lm_head.weight: 12 NaN values"),
    ("load without checksums", "load", _patched("load", _set("shards", [])), "incomplete",
     "load: shards missing"),
    ("serve without the text path", "serve", {"ready_seconds": 1.0, "endpoint": "http://x"}, "incomplete",
     "serve: text path not answered"),
    ("plan that does not split", "plan", _patched("plan", _set("plan", {"tp": 3, "pp": 1, "ep": 1, "devices": 3})),
     "fail", "no valid plan with tp=3 pp=1 ep=1"),
    ("plan without degrees", "plan", {"fits": True}, "incomplete", "plan: plan missing"),
    ("a fit claimed on a zero memory need", "plan", _patched("plan", _set("bytes_per_device", 0)), "fail",
     "bytes_per_device 0 is not a memory need per device"),
    ("compiled tokens that differ, claimed passed", "align", _patched("align", lambda s: s.__setitem__(
        "compile", {"passed": True, "equal": True, "rows": [{"eager": [5, 6, 7, 8], "compiled": [5, 6, 9, 8]}]})),
     "fail", "compile prompt 0: compiled greedy tokens differ from eager ones at position 2"),
    ("a compile block without its token rows", "align",
     _patched("align", lambda s: s.__setitem__("compile", {"passed": True, "equal": True})), "incomplete",
     "compile rows missing"),
    ("eval without raw outputs", "eval", passing("eval"), "incomplete", "eval: raw outputs missing"),
    # an external engine's internals are "not applicable": on the bundled engine that claim must not stand in for
    # the evidence it replaces
    ("align claimed not applicable", "align", {"applicable": False, "reason": "external engine", "engine": "vllm"},
     "incomplete", "align not applicable"),
    ("serve claimed not applicable", "serve", {"applicable": False, "reason": "external engine"}, "incomplete",
     "serve not applicable"),
    # an external engine's endpoint align (e2e + KV self-consistency) on the bundled engine stands for nothing
    ("endpoint align claimed on the bundled runtime", "align", endpoint_align(), "incomplete",
     "endpoint align (method 'endpoint') is an external engine's align"),
]


@pytest.fixture
def cell() -> tuple:
    return agent_cell()





@pytest.mark.parametrize(("case", "stage", "section", "verdict", "reason"), FORGED, ids=[f[0] for f in FORGED])
def test_forged_or_broken_results_leave_the_tier_and_name_the_reason(api_client, cell, case, stage, section,
                                                                     verdict, reason) -> None:
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware)
    below = GATE_TIER[stage] - 1
    climb_to(api_client, job, token, below)
    if case != "eval without raw outputs":
        section = answer(job, stage, section)
    response = post_result(api_client, job, token, {"stage": stage, "section": section})
    assert response.status_code == 201, response.content
    body = response.json()
    stored = body["stored"][0]
    assert stored["verdict"] == verdict, stored
    assert any(reason in r for r in stored["reasons"]), stored["reasons"]
    assert body["cell"]["tier"] == below  # the tier stays where it was
    assert body["cell"]["failed_stage"] == stage and reason in body["cell"]["error"]
    claimed = section.get({"plan": "fits", "load": "ok", "align": "passed", "serve": "text_path_ok",
                           "eval": "passed"}.get(stage, ""))
    assert stored["claimed_passed"] == claimed and stored["disputed"] is (claimed is True)
    detail = api_client.get(f"/api/v1/cells/{model.slug}/{hardware.slug}/").json()
    assert detail["tier"] == below and detail["verdicts"][stage]["status"] == verdict
    assert any(reason in r for r in detail["verdicts"][stage]["reasons"])
    assert detail["evidence"]["stages"][stage]["verdict"] == verdict
    assert (stage in detail["disputed"]) is (claimed is True)
    if claimed is True:  # the matrix says the claim is refuted
        row = next(r for r in api_client.get("/api/v1/matrix/").json()["models"] if r["slug"] == model.slug)
        assert row["cells"][hardware.slug]["disputed"] == [stage]


def test_honest_evidence_still_climbs_to_validated(api_client, cell) -> None:
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware)
    climb_to(api_client, job, token, 6)
    cell_row = Cell.objects.get(model=model, hardware=hardware)
    assert cell_row.tier == 6 and cell_row.disputed == [] and not cell_row.custom_thresholds


def test_a_shard_digest_differing_from_the_manifest_fails_load_naming_both(api_client, cell) -> None:
    model, hardware, token = cell
    owner = make_token(organization=model.organization)
    manifest = [{"name": s["file"], "size": None, "sha256": s["sha256"]} for s in PASSING["load"]["shards"]]
    manifest[1]["sha256"] = "c" * 64
    response = api_client.patch(f"/api/v1/models/{model.slug}/", {"manifest": manifest, "tensor_count": 201},
                                format="json", **auth(owner))
    assert response.status_code == 200 and response.json()["manifest_source"] == "given", response.content
    job = JobFactory(model=model, hardware=hardware)
    assert api_client.get(f"/api/v1/jobs/{job.pk}/", **auth(token)).json()["manifest"] is None  # not for the agent
    assert api_client.get(f"/api/v1/jobs/{job.pk}/", **auth(owner)).json()["manifest"] == manifest  # for users
    climb_to(api_client, job, token, 1)
    body = post_result(api_client, job, token, {"stage": "load", "section": passing("load")}).json()
    assert body["cell"]["tier"] == 1 and body["stored"][0]["disputed"] is True
    assert (f"load: shard model-00002-of-00002.safetensors sha256 {'b' * 64} differs from the manifest's "
            f"{'c' * 64}") in body["stored"][0]["reasons"]
    wrong_count = _patched("load", _set("tensors", 200))
    new_attempt(job)  # a stage is posted once per attempt
    body = post_result(api_client, job, token, {"stage": "load", "section": wrong_count}).json()
    assert "load: 200 tensors loaded, the model declares 201" in body["stored"][0]["reasons"]


@pytest.mark.parametrize("manifest", [
    [{"name": "a.safetensors", "size": 1, "sha256": "xyz"}],
    [{"name": "../a.safetensors", "size": 1, "sha256": "a" * 64}],
    [{"name": "a.safetensors", "size": -1, "sha256": "a" * 64}],
    [{"name": "a", "size": 1, "sha256": "a" * 64}, {"name": "a", "size": 1, "sha256": "a" * 64}],
    [{"name": "a", "size": 1, "sha256": "a" * 64, "md5": "x"}],
    {"a": "b"},
    [{"name": f"f{i}", "size": 1, "sha256": "a" * 64} for i in range(10_001)],
])
def test_a_bad_manifest_is_400_naming_the_field(api_client, cell, manifest) -> None:
    model, _, _ = cell
    owner = make_token(organization=model.organization)
    response = api_client.patch(f"/api/v1/models/{model.slug}/", {"manifest": manifest}, format="json", **auth(owner))
    assert response.status_code == 400 and "manifest" in response.json(), response.content
    assert ModelRelease.objects.get(pk=model.pk).manifest == []


@pytest.mark.parametrize(("thresholds", "message"), [
    ({"op_cosine": -1}, "threshold op_cosine: -1 is outside its range (0, 1]"),
    ({"layer_cosine": 1.5}, "threshold layer_cosine: 1.5 is outside its range (0, 1]"),
    ({"op_max_rel_err": -0.01}, "threshold op_max_rel_err: -0.01 is outside its range [0, inf]"),
    ({"e2e_top_k": 0}, "threshold e2e_top_k: 0 is outside its range an integer in [1, 100]"),
    ({"e2e_top_k": 2.5}, "threshold e2e_top_k: 2.5 is outside its range an integer in [1, 100]"),
    ({"bench_max_failure_ratio": 2}, "threshold bench_max_failure_ratio: 2 is outside its range [0, 1]"),
    ({"kv_cache_max_len": 0}, "threshold kv_cache_max_len: 0 is outside its range an integer in [1, 10000000]"),
    ({"kv_cache_max_len": 4096}, "threshold kv_cache_max_len: 4096 is longer than the model's context length 2048"),
])
def test_out_of_range_thresholds_are_400_at_submit_naming_key_and_range(api_client, cell, thresholds,
                                                                        message) -> None:
    model, hardware, _ = cell
    submitter = make_token(organization=model.organization)
    response = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug,
                                                 "thresholds": thresholds}, format="json", **auth(submitter))
    assert response.status_code == 400, response.content
    assert message in str(response.json()["thresholds"])


def test_looser_thresholds_mark_the_job_and_every_tier_it_reaches(api_client, cell) -> None:
    model, hardware, token = cell
    submitter = make_token(organization=model.organization)
    response = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug,
                                                 "thresholds": {"layer_cosine": 0.5, "op_cosine": 0.9999}},
                               format="json", **auth(submitter))
    assert response.status_code == 201 and response.json()["custom_thresholds"] == ["layer_cosine"]
    job = JobFactory(model=model, hardware=hardware,
                     spec={**JobFactory.spec.function(), "thresholds": {"layer_cosine": 0.5}})
    climb_to(api_client, job, token, 3)
    weak = _patched("align", _set("layers.5.cosine", 0.8))  # passes only under the looser threshold
    body = post_result(api_client, job, token, {"stage": "align", "section": answer(job, "align", weak)}).json()
    assert body["stored"][0]["verdict"] == "pass" and body["stored"][0]["custom_thresholds"] == ["layer_cosine"]
    assert body["cell"] == {**body["cell"], "tier": 4, "custom_thresholds": True}
    row = next(r for r in api_client.get("/api/v1/matrix/").json()["models"] if r["slug"] == model.slug)
    assert row["cells"][hardware.slug]["custom_thresholds"] is True
    assert api_client.get(f"/api/v1/cells/{model.slug}/{hardware.slug}/").json()["custom_thresholds"] is True
    # the same numbers under the defaults do not pass
    strict = JobFactory(model=model, hardware=hardware)
    body = post_result(api_client, strict, token, {"stage": "align", "section": answer(strict, "align", weak)}).json()
    assert body["stored"][0]["verdict"] == "fail" and body["cell"]["tier"] == 3
    assert StageResult.objects.filter(job=job, stage="align", verdict="pass").exists()  # nothing lost


def test_the_issues_forgery_as_one_report_stays_at_serves(api_client, client, cell) -> None:
    """A forged report: ``{"align": {"passed": true}}`` and a bench whose only run has 99 failed requests."""
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware)
    climb_to(api_client, job, token, 3)
    bench = {**passing("bench"), "runs": [{**PASSING["bench"]["runs"][0], "failed": 99, "completed": 1}]}
    report = {"hardware": hardware.slug, "tier": 5, "failed_stage": None, "error": None,
              "stages": {"align": {"passed": True}, "bench": bench}}
    body = post_result(api_client, job, token, report).json()
    verdicts = {r["stage"]: r for r in body["stored"]}
    assert verdicts["align"]["verdict"] == "incomplete" and verdicts["align"]["disputed"] is True
    assert verdicts["align"]["reasons"][:2] == ["align: ops missing", "align: layers missing"]
    assert "align: kv_cache missing" in verdicts["align"]["reasons"]
    assert "bench: run at concurrency 1 has 99 of 100 failed requests" in verdicts["bench"]["reasons"]
    assert body["cell"]["tier"] == 3 and body["cell"]["failed_stage"] == "align"
    assert Cell.objects.get(model=model, hardware=hardware).tier == 3
    matrix_page = client.get("/").content.decode()
    assert "claim refuted: align, bench" not in matrix_page  # bench claims nothing: only align is refuted
    assert "claim refuted: align</span>" in matrix_page
    cell_page = client.get(f"/cells/{model.slug}/{hardware.slug}/").content.decode()
    assert 'id="mark-disputed"' in cell_page and "align: kv_cache missing" in cell_page
