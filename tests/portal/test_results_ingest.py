"""Agents post stage results; they become queryable evidence rows and the cell is recomputed. A document for
the wrong stage, job or hardware stores nothing."""

from __future__ import annotations

import pytest

from apps.evidence.models import (
    AlignmentLayer,
    AlignmentOp,
    BenchmarkPoint,
    EnvLock,
    LoadReport,
    OperatorCheck,
    PlanEvidence,
    ShardChecksum,
    StageResult,
    TokenDivergence,
)
from apps.jobs.choices import JobState
from apps.matrix.models import Cell
from contract.thresholds import DEFAULTS_VERSION
from tests.factories import HardwareFactory, JobFactory, OrganizationFactory, auth, make_token
from tests.portal.challenges import answered
from tests.portal.reports import PASSING, bound, new_attempt, passing

pytestmark = pytest.mark.django_db


@pytest.fixture
def agent_job() -> tuple:
    hardware = HardwareFactory()
    job = JobFactory(hardware=hardware)
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    return job, token


def test_a_whole_report_becomes_rows_and_a_tier(api_client, agent_job) -> None:
    job, token = agent_job
    report = {"model": {"name": "x", "architecture": "LlamaForCausalLM", "path": "native"},
              "hardware": job.hardware.slug,
              "dtype": "bfloat16", "tier": 6, "failed_stage": None, "error": None, "stages": answered(job, PASSING)}
    response = api_client.post(f"/api/v1/jobs/{job.pk}/results/", bound(job, report), format="json", **auth(token))
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["cell"] == {"tier": 6, "tier_name": "validated", "failed_stage": "", "error": "",
                            "custom_thresholds": False, "disputed": []}
    assert {r["stage"]: r["verdict"] for r in body["stored"]} == {s: "pass" for s in PASSING}
    assert all(r["defaults_version"] == DEFAULTS_VERSION and not r["disputed"] for r in body["stored"])
    assert PlanEvidence.objects.get(result__job=job).devices == 1
    assert LoadReport.objects.get(result__job=job).ok and ShardChecksum.objects.filter(load__result__job=job).count() == 2
    assert set(OperatorCheck.objects.filter(result__job=job).values_list("status", flat=True)) == {
        "native", "decomposed", "fallback"}
    assert AlignmentOp.objects.filter(report__result__job=job).count() == len(PASSING["align"]["ops"])
    assert AlignmentLayer.objects.filter(report__result__job=job).count() == 22
    divergence = TokenDivergence.objects.get(report__result__job=job)
    assert divergence.near_tie and divergence.position == 17
    points = BenchmarkPoint.objects.filter(run__result__job=job).order_by("concurrency")
    assert [p.concurrency for p in points] == [1, 4, 16] and points[2].ttft_ms_p99 == PASSING["bench"]["runs"][2]["ttft_ms"]["p99"]
    assert EnvLock.objects.get(result__job=job).torch == "2.13.0"
    detail = api_client.get(f"/api/v1/cells/{job.model.slug}/{job.hardware.slug}/").json()
    assert detail["tier"] == 6 and len(detail["evidence"]["benchmarks"][0]["points"]) == 3
    assert detail["evidence"]["alignment"]["divergences"][0]["near_tie"] is True


def test_stage_by_stage_posts_climb_and_a_new_attempt_replaces_a_stage(api_client, agent_job) -> None:
    job, token = agent_job
    url = f"/api/v1/jobs/{job.pk}/results/"
    for stage, tier in (("plan", 1), ("load", 2), ("serve", 3)):
        response = api_client.post(url, bound(job, {"stage": stage, "section": passing(stage)}), format="json",
                                   **auth(token))
        assert response.status_code == 201 and response.json()["cell"]["tier"] == tier
    new_attempt(job)  # the job went out again: its next attempt posts the stage anew
    response = api_client.post(url, bound(job, {"stage": "load", "section": passing("load")}), format="json",
                               **auth(token))
    assert response.status_code == 201, response.content
    assert StageResult.objects.get(job=job, stage="load").attempt == 2  # replaced by the newer attempt's
    assert LoadReport.objects.filter(result__job=job).count() == 1


@pytest.mark.parametrize(("doc", "key"), [
    ({"stage": "dance", "section": {}}, "stage"),
    ({"stage": "plan"}, "section"),
    ({"stage": "plan", "section": {"params_total": 5, "fits": "sure"}}, "stages.plan.fits"),
    ({"stage": "plan", "section": {**PASSING["plan"], "weight_bytes": 1e300}}, "stages.plan.weight_bytes"),
    ({"stage": "load", "section": {**PASSING["load"], "seconds": 1e300}}, "stages.load.seconds"),
    ({"stage": "load", "section": {**PASSING["load"], "stats": {"w": {"absmax": -1e300}}}}, "stages.load.stats.w.absmax"),
    ({"stage": "load", "section": {**PASSING["load"], "tensors": 2**70}}, "stages.load.tensors"),
    ({"stage": "load", "section": {**PASSING["load"], "problems": [{"tensor": "t", "problem": "nan"}] * 100_000}},
     "stages.load.problems"),
    ({"stage": "bench", "section": {"runs": [PASSING["bench"]["runs"][0]] * 20_000}}, "stages.bench.runs"),
    ({"stage": "plan", "section": {**PASSING["plan"], "plan": {"tp": 2**40, "pp": 1, "ep": 1, "devices": 1}}},
     "stages.plan.plan.tp"),
    ({"stage": "bench", "section": {"runs": [{**PASSING["bench"]["runs"][0], "concurrency": 2**40}]}},
     "stages.bench.runs[0].concurrency"),
    ({"stage": "align", "section": {**PASSING["align"], "layers": PASSING["align"]["layers"] * 100}},
     "stages.align.layers"),
    ({"stage": "load", "section": {"ok": "yes"}}, "stages.load.ok"),
    ({"stage": "bench", "section": {"runs": [{"concurrency": "many"}]}}, "stages.bench.runs[0].concurrency"),
    ({"stage": "inventory", "section": {"ops": [{"op": "aten::mm", "status": "perhaps"}]}},
     "stages.inventory.ops[0].status"),
    ({"stages": {"plan": PASSING["plan"], "align": {"passed": True, "layers": [{"layer": "x", "passed": True}]}}},
     "stages.align.layers[0].layer"),
    ([1, 2, 3], "detail"),
])
def test_bad_documents_are_400_naming_the_path_and_store_nothing(api_client, agent_job, doc, key) -> None:
    job, token = agent_job
    response = api_client.post(f"/api/v1/jobs/{job.pk}/results/", bound(job, doc), format="json", **auth(token))
    assert response.status_code == 400 and key in response.json(), response.content
    assert not StageResult.objects.exists() and not PlanEvidence.objects.exists()


def test_a_report_for_another_hardware_is_refused(api_client, agent_job) -> None:
    job, token = agent_job
    report = {"hardware": "someone-elses-npu", "stages": {"plan": passing("plan")}}
    response = api_client.post(f"/api/v1/jobs/{job.pk}/results/", bound(job, report), format="json", **auth(token))
    assert response.status_code == 400 and "someone-elses-npu" in response.json()["hardware"][0]
    assert not StageResult.objects.exists()


def test_a_stage_the_job_did_not_request_is_refused(api_client) -> None:
    hardware = HardwareFactory()
    job = JobFactory(hardware=hardware, spec={"stages": ["plan"]})
    token = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=hardware)
    response = api_client.post(f"/api/v1/jobs/{job.pk}/results/", bound(job, {"stage": "load",
                               "section": passing("load")}), format="json", **auth(token))
    assert response.status_code == 400 and "not requested" in response.json()["stage"][0]
    assert not StageResult.objects.exists()


def test_wrong_hardware_or_scope_is_403_and_a_finished_job_409(api_client, agent_job) -> None:
    job, token = agent_job
    url = f"/api/v1/jobs/{job.pk}/results/"
    body = bound(job, {"stage": "plan", "section": passing("plan")})
    other = make_token(organization=OrganizationFactory(), scopes=["agent"], hardware=HardwareFactory())
    assert api_client.post(url, body, format="json", **auth(other)).status_code == 403
    assert api_client.post(url, body, format="json", **auth(make_token(organization=job.organization))
                           ).status_code == 403
    job.state = JobState.CANCELLED
    job.save()
    assert api_client.post(url, body, format="json", **auth(token)).status_code == 409
    assert not StageResult.objects.exists()
    assert Cell.objects.get(model=job.model, hardware=job.hardware).tier == 0


def test_agents_report_state_through_the_state_machine(api_client, agent_job) -> None:
    job, token = agent_job
    url = f"/api/v1/jobs/{job.pk}/state/"
    response = api_client.post(url, {"state": "failed", "failed_stage": "align", "error": "layer 3 cosine 0.91"},
                               format="json", **auth(token))
    assert response.status_code == 200 and response.json()["state"] == "failed"
    cell = Cell.objects.get(model=job.model, hardware=job.hardware)
    assert cell.failed_stage == "align" and "0.91" in cell.error
    assert api_client.post(url, {"state": "running"}, format="json", **auth(token)).status_code == 409


def test_the_benchmark_sweeps_peak_memory_is_kept_on_its_points(api_client, agent_job) -> None:
    job, token = agent_job
    runs = [{**run, "peak_memory_bytes": None} for run in PASSING["bench"]["runs"]]
    runs[0]["peak_memory_bytes"] = 123  # a run's own figure wins over the sweep's
    section = {**PASSING["bench"], "runs": runs, "peak_memory_bytes": 421_445_632}  # as agents.runtime.bench reports it
    response = api_client.post(f"/api/v1/jobs/{job.pk}/results/", bound(job, {"stage": "bench", "section": section}),
                               format="json", **auth(token))
    assert response.status_code == 201, response.content
    points = BenchmarkPoint.objects.filter(run__result__job=job).order_by("concurrency")
    assert [p.peak_memory_bytes for p in points] == [123, 421_445_632, 421_445_632]
