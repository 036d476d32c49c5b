"""Physically impossible or inconsistent bench and align evidence, posted through the REST API with a real agent
token: none raises the tier, and the stored verdict names what was wrong."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from apps.evidence.models import StageResult
from apps.matrix.models import Cell
from tests.factories import HardwareFactory, JobFactory, ModelReleaseFactory, OrganizationFactory, auth, make_token
from tests.portal.challenges import answer
from tests.portal.forger import agent_cell
from tests.portal.reports import PASSING, TIER_STAGES, bound, new_attempt, passing

pytestmark = pytest.mark.django_db

Patch = Callable[[dict[str, Any]], None]


def _runs(**changes: Any) -> Patch:
    def patch(section: dict[str, Any]) -> None:
        for run in section["runs"]:
            run.update(copy.deepcopy(changes))
    return patch


def _run(level: int, **changes: Any) -> Patch:
    def patch(section: dict[str, Any]) -> None:
        next(r for r in section["runs"] if r["concurrency"] == level).update(copy.deepcopy(changes))
    return patch


def _set(path: str, value: Any) -> Patch:
    def patch(section: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node = section
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[last] = copy.deepcopy(value)
    return patch


def _patched(stage: str, *patches: Patch) -> dict[str, Any]:
    section = passing(stage)
    for patch in patches:
        patch(section)
    return section


FAST_TPOT = {"mean": 0.001, "p50": 0.001, "p90": 0.001, "p99": 0.001}
RUN_4 = PASSING["bench"]["runs"][1]

# (case, stage, forged section, a phrase the stored verdict's reasons must contain)
FORGED: list[tuple[str, str, dict[str, Any], str]] = [
    ("1e9 tok/s", "bench", _patched("bench", _runs(output_tok_s=1e9)),
     "run at concurrency 1: output 1e+09 tok/s is above concurrency 1 × 1000 / TPOT 9.5 ms"),
    ("TPOT 0.001 ms", "bench", _patched("bench", _runs(tpot_ms=FAST_TPOT, itl_ms=FAST_TPOT)),
     "run at concurrency 1: TPOT p50 0.001 ms is below the physical floor"),
    ("tok/s above concurrency × 1000 / TPOT", "bench",
     _patched("bench", _run(4, output_tok_s=600.0, duration_s=round(RUN_4["output_tokens"] / 600.0, 3))),
     "run at concurrency 4: output 600 tok/s is above concurrency 4 × 1000 / TPOT 9.5 ms = 421.1 tok/s"),
    ("Little's law broken", "bench", _patched("bench", _run(4, req_s=RUN_4["req_s"] * 3)),
     "run at concurrency 4: Little's law"),
    ("completed + failed ≠ asked", "bench",
     _patched("bench", _run(4, completed=20, prompts=20, samples={**RUN_4["samples"], "ttft_ms": 20, "e2e_ms": 20})),
     "run at concurrency 4: completed + failed = 20, the level was asked 32 prompts"),
    ("fewer levels than asked", "bench", _patched("bench", lambda s: s["runs"].pop()),
     "the levels run [1, 4] are not the levels asked [1, 4, 16] (missing [16])"),
    ("ignore-EOS lengths off", "bench", _patched("bench", _run(4, output_tokens=RUN_4["output_tokens"] // 4)),
     "run at concurrency 4: 16.0 output tokens per request on an ignore-EOS run asked 64"),
    ("repeated-prompt probe much faster", "bench",
     _patched("bench", _set("probe.repeated.output_tok_s", PASSING["bench"]["probe"]["fresh"]["output_tok_s"] * 3)),
     "repeated-prompt probe at concurrency 16"),
    ("no probe", "bench", _patched("bench", lambda s: s.pop("probe")), "bench: probe missing"),
    ("a level of 8 requests", "bench", _patched("bench", _set("requested.num_prompts", 8), _runs(
        prompts=8, completed=8)), "requests, a baseline level needs at least 16"),
    ("cosine 1.5", "align", _patched("align", _set("ops.0.cosine", 1.5)), "op matmul cosine 1.5 is outside [-1, 1]"),
    ("negative error", "align", _patched("align", _set("ops.1.max_rel_err", -0.01)),
     "op attention max_rel_err -0.01 is not an error"),
    ("exactly zero error at bfloat16", "align", _patched("align", _set("layers.3.max_rel_err", 0.0)),
     "layer 3: exactly zero error at bfloat16 is not a measurement"),
    # the agent's own match rate is a claim: without raw outputs for the portal to score, e2e is incomplete
    ("token match 0.0", "align", _patched("align", _set("e2e.token_match_rate", 0.0), _set("e2e.divergences", []),
                                          _set("e2e.raw", None)),
     "align: e2e: raw outputs missing"),
    ("one operator", "align", _patched("align", lambda s: s.__setitem__("ops", s["ops"][:1])),
     "ops: 1 operator check(s), a native model's alignment runs at least 4"),
    ("one layer twenty-two times", "align",
     _patched("align", lambda s: [row.__setitem__("layer", 0) for row in s["layers"]]),
     "layers: decoder layer(s) [1, 2, 3, 4, 5, 6, 7, 8] not compared (the model has 22)"),
]


@pytest.fixture
def cell() -> tuple:
    return agent_cell()


def _post(api_client: Any, job: Any, token: Any, stage: str, section: dict[str, Any]) -> dict[str, Any]:
    response = api_client.post(f"/api/v1/jobs/{job.pk}/results/",
                               bound(job, {"stage": stage, "section": answer(job, stage, section)}),
                               format="json", **auth(token))
    assert response.status_code == 201, response.content
    return response.json()


def _climb(api_client: Any, job: Any, token: Any, tier: int) -> None:
    for stage in TIER_STAGES[tier]:
        body = _post(api_client, job, token, stage, passing(stage))
        assert body["stored"][0]["verdict"] == "pass", body["stored"][0]["reasons"]


@pytest.mark.parametrize(("case", "stage", "section", "reason"), FORGED, ids=[f[0] for f in FORGED])
def test_forged_physics_leaves_the_tier_and_names_the_reason(api_client, cell, case, stage, section,
                                                            reason) -> None:
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware)
    below = {"align": 3, "bench": 4}[stage]
    _climb(api_client, job, token, below)
    body = _post(api_client, job, token, stage, section)
    stored = body["stored"][0]
    assert stored["verdict"] in ("fail", "incomplete"), stored
    assert any(reason in r for r in stored["reasons"]), stored["reasons"]
    assert body["cell"]["tier"] == below
    row = StageResult.objects.get(job=job, stage=stage)
    assert row.verdict == stored["verdict"] and any(reason in r for r in row.reasons)
    assert Cell.objects.get(model=model, hardware=hardware).tier == below


def test_the_honest_bench_reaches_baselined_and_notes_its_short_p99(api_client, cell) -> None:
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware)
    _climb(api_client, job, token, 5)
    assert Cell.objects.get(model=model, hardware=hardware).tier == 5
    notes = StageResult.objects.get(job=job, stage="bench").verdict_notes
    assert "bench: run at concurrency 1: p99 of 32 samples (fewer than 100) is the maximum" in notes


def test_a_load_path_fallback_on_a_native_architecture_is_named_and_its_ops_still_judged(api_client, cell) -> None:
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware)
    _climb(api_client, job, token, 1)
    _post(api_client, job, token, "load", {**passing("load"), "path": "fallback"})
    _post(api_client, job, token, "serve", passing("serve"))
    unchecked = [{"op": "all operators", "status": "unchecked", "cosine": None, "passed": None}]
    body = _post(api_client, job, token, "align", {**passing("align"), "ops": unchecked})
    reasons = body["stored"][0]["reasons"]
    assert ("align: the load section says the fallback path, but the runtime runs LlamaForCausalLM on the native "
            "path (decided from the config)") in reasons
    assert body["stored"][0]["verdict"] == "fail" and body["cell"]["tier"] == 3


def test_levels_and_prompts_asked_by_the_job_decide_over_the_sections_word(api_client, cell) -> None:
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware, spec={**JobFactory.spec.function(),
                                                           "bench": {"concurrency": [1, 4, 16, 64]}})
    _climb(api_client, job, token, 4)
    body = _post(api_client, job, token, "bench", passing("bench"))
    reasons = body["stored"][0]["reasons"]
    assert "bench: requested concurrency [1, 4, 16] differs from the job's [1, 4, 16, 64]" in reasons
    assert "bench: the levels run [1, 4, 16] are not the levels asked [1, 4, 16, 64] (missing [64])" in reasons
    assert body["cell"]["tier"] == 4


def test_operator_coverage_is_measured_against_the_jobs_inventory(api_client, cell) -> None:
    model, hardware, token = cell
    job = JobFactory(model=model, hardware=hardware)
    _climb(api_client, job, token, 3)
    inventory = passing("inventory")
    inventory["ops"].append({"op": "aten::argmax", "count": 8, "dtypes": ["bfloat16"], "status": "native",
                             "decomposes_to": []})
    _post(api_client, job, token, "inventory", inventory)
    body = _post(api_client, job, token, "align", passing("align"))
    assert ("align: ops: 1 operator(s) of the inventory have no align check and no reason: aten::argmax"
            in body["stored"][0]["reasons"]) and body["cell"]["tier"] == 3
    listed = passing("align")
    listed["inventory_coverage"] = {"not_exercised": ["aten::argmax"],
                                    "not_exercised_reasons": {"aten::argmax": "the engine's greedy pick"}}
    new_attempt(job)  # a stage is posted once per attempt: the corrected section comes with the next one
    body = _post(api_client, job, token, "align", listed)
    assert body["stored"][0]["verdict"] == "pass" and body["cell"]["tier"] == 4


def test_a_bench_without_a_bandwidth_notes_the_floor_was_not_checked(api_client) -> None:
    hardware = HardwareFactory(memory_bandwidth_gbps=None)
    model = ModelReleaseFactory()
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    job = JobFactory(model=model, hardware=hardware)
    _climb(api_client, job, token, 4)
    body = _post(api_client, job, token, "bench", _patched("bench", _runs(tpot_ms=FAST_TPOT, itl_ms=FAST_TPOT)))
    assert not any("physical floor" in r for r in body["stored"][0]["reasons"])
    notes = StageResult.objects.get(job=job, stage="bench").verdict_notes
    assert "bench: TPOT floor not checked: the hardware states no memory bandwidth" in notes


@pytest.mark.parametrize(("bench", "field", "message"), [
    ({"min_seconds": -1}, "min_seconds", "must be a number from 0 to 86400, got -1"),
    ({"probe": "yes"}, "probe", "must be true or false, got 'yes'"),
])
def test_the_bench_length_and_probe_settings_of_a_job_are_bounded(api_client, cell, bench, field, message) -> None:
    model, hardware, _ = cell
    submitter = make_token(organization=model.organization)
    response = api_client.post("/api/v1/jobs/", {"model": model.slug, "hardware": hardware.slug, "bench": bench},
                               format="json", **auth(submitter))
    assert response.status_code == 400 and message in str(response.json()["bench"][field]), response.content
