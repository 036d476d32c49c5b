"""The cell and job pages show the runtime's newer evidence: the compiled path (serve, bench and align
``compile`` blocks, only when present), every benchmark run's communication overhead (rank 0, per rank, the
slowest rank), TPOT jitter and MoE expert balance, the soak's device memory, and a multi-node job's nodes."""

from __future__ import annotations

import copy
import re

import pytest

from agents.pipeline.stages.align.compiled import compare
from apps.evidence.services import do_record_stage_results
from apps.jobs.models import JobNode, NodeState
from tests.factories import JobFactory
from tests.portal.reports import passing
from tests.portal.test_schemathesis import api_schema, wsgi_app  # noqa: F401 - fixtures: the schema over WSGI

pytestmark = pytest.mark.django_db

CACHE = {"fxgraph_hit": 3, "fxgraph_miss": 1, "fxgraph_bypass": 0, "aot_autograd_hit": 2, "aot_autograd_miss": 2,
         "aot_autograd_bypass": 0, "aot_autograd_saved": 0}
SERVE_COMPILE = {"requested": True, "enabled": True, "compile_seconds": 41.5, "graphs": 4, "graph_breaks": 0,
                 "graph_break_reasons": [], "recompiles_after_warmup": 0, "recompile_reasons": [], "cache": CACHE,
                 "ready_seconds": 55.2}
BENCH_COMPILE = {"requested": True, "enabled": True, "concurrency": 4,
                 "compiled": {"concurrency": 4, "output_tok_s": 420.0, "tpot_ms_p50": 8.1},
                 "eager": {"concurrency": 4, "output_tok_s": 300.0, "tpot_ms_p50": 11.3},
                 "speedup_output_tok_s": 1.4, "note": "compiled and eager measured one after the other"}
BALANCE = {"layers": 2, "experts": 8, "max_over_mean": 1.37, "worst_layer_max_over_mean": 1.61, "cv": 0.21,
           "routed_tokens": 1600, "tokens_per_expert": [260, 150, 230, 170, 240, 160, 210, 180], "ep_size": 2,
           "tokens_per_ep_rank": [810, 790], "ep_max_over_mean": 1.02}


def _align_compile(diverge: bool) -> dict:
    eager = [[(5, {5, 6}), (7, {7, 8}), (9, {9, 1})], [(2, {2, 3}), (4, {4, 5})]]
    compiled = copy.deepcopy(eager)
    if diverge:  # a near-tie at prompt 1's second token
        compiled[1][1] = (5, {5, 4})
    block = compare(eager, compiled)
    return {"requested": True, "enabled": True, "prompts": 2, "new_tokens": 3, "top_k": 2, **block,
            "compile_seconds": 12.0, "graphs": 2, "graph_breaks": 0, "graph_break_reasons": [],
            "recompiles_after_warmup": 0, "recompile_reasons": [], "cache": CACHE, "cache_dir": "", "compiler": "g++"}


def _bench(moe: bool) -> dict:
    section = passing("bench")
    for i, run in enumerate(section["runs"]):
        run.update({"comm_overhead_ratio": 0.04 + 0.01 * i, "comm_overhead_ratio_per_rank": [0.04 + 0.01 * i, 0.09],
                    "comm_overhead_ratio_max": 0.09, "tpot_jitter": 1.58})
        if moe:
            run["expert_balance"] = BALANCE
    return section


def _page(client, job) -> str:  # noqa: ANN001
    response = client.get(f"/cells/{job.model.slug}/{job.hardware.slug}/")
    assert response.status_code == 200
    return response.content.decode()


def _text(html: str, element_id: str) -> str:
    """The text of the element with ``element_id`` (up to the first closing tag of its own name)."""
    match = re.search(rf'<(\w+)[^>]*\bid="{element_id}"[^>]*>(.*?)</\1>', html, re.S)
    assert match, element_id
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", match.group(2))).strip()


def test_the_cell_page_shows_the_compiled_path_beside_eager(client) -> None:
    job = JobFactory(spec={"stages": ["serve", "align", "bench"], "dtype": "float32", "bench": {"compile": True}})
    align = {**passing("align"), "compile": _align_compile(diverge=True)}
    do_record_stage_results(job, {"serve": {**passing("serve"), "compile": SERVE_COMPILE}, "align": align,
                                  "bench": {**_bench(moe=False), "compile": BENCH_COMPILE}})
    html = _page(client, job)
    serve = _text(html, "compiled-serve")
    for words in ("compile seconds 41.5", "graphs 4", "graph breaks 0", "recompiles after warm-up 0",
                  "FX graph cache 3 hits · 1 miss", "AOT autograd cache 2 hits · 2 misses", "server ready 55.2 s"):
        assert words in serve, (words, serve)
    bench = _text(html, "compiled-bench")
    assert "compiled 420.0 tok/s" in bench and "eager 300.0 tok/s" in bench and "1.40×" in bench
    assert "one after the other" in bench  # the noise note
    align_text = _text(html, "compiled-align")
    assert "✓ passed" in align_text and "differ" in align_text and "80.0 % of 5 tokens" in align_text
    assert "prompt 1, token 1: eager 4 vs compiled 5 — near-tie" in _text(html, "compiled-divergence")


def test_an_eager_job_shows_no_compiled_card_and_a_skipped_one_says_why(client) -> None:
    job = JobFactory(spec={"stages": ["serve", "bench"], "dtype": "float32"})
    do_record_stage_results(job, {"serve": passing("serve"), "bench": passing("bench")})
    assert 'id="compiled-path"' not in _page(client, job)
    skipped = {"requested": True, "enabled": False, "reason": "the compiled path serves one process; this job "
               "serves tp=2, ep=1, pp=1"}
    job2 = JobFactory(model=job.model, hardware=job.hardware, spec={"stages": ["serve"], "dtype": "float32"})
    do_record_stage_results(job2, {"serve": {**passing("serve"), "compile": skipped}})
    assert "ran eager: the compiled path serves one process" in _text(_page(client, job), "compiled-serve")


def test_every_bench_run_shows_comm_overhead_per_rank_jitter_and_expert_balance(client) -> None:
    job = JobFactory(spec={"stages": ["bench"], "dtype": "float32"})
    do_record_stage_results(job, {"bench": _bench(moe=True)})
    html = _page(client, job)
    table = _text(html, "bench-extras")
    assert "comm overhead (rank 0)" in table and "expert max/mean" in table
    rows = re.findall(r'<tr data-concurrency="(\d+)"', html)
    assert rows == ["1", "4", "16"]
    assert "4.0 % 4.0 % · 9.0 % 9.0 % 1.58×" in table  # rank 0, both ranks, the slowest, TPOT p99/p50
    assert "6.0 % 6.0 % · 9.0 % 9.0 %" in table
    assert "1.37 (worst layer 1.61)" in table and "8 experts, 150–260 tokens each" in table
    assert "EP ranks: 810 · 790 tokens · max/mean 1.02" in table
    assert html.count('<svg class="expert-bars"') == 3 and html.count("<rect ") >= 24  # a bar per expert per run


def test_a_dense_model_run_from_before_the_keys_shows_its_jitter_and_no_expert_columns(client) -> None:
    job = JobFactory(spec={"stages": ["bench"], "dtype": "float32"})
    do_record_stage_results(job, {"bench": passing("bench")})  # no comm / jitter / expert keys
    table = _text(_page(client, job), "bench-extras")
    assert "expert" not in table
    assert table.count("1.58×") == 3  # p99 15.0 / p50 9.5 from the percentiles
    assert "—" in table and "one rank" in table


SOAK = {"seconds": 60.0, "passed": True, "memory_slope": 1200.0, "crashes": 0, "recover_seconds": 8.5}


def test_the_soak_card_draws_device_memory_on_cuda_and_says_process_rss_on_cpu(client) -> None:
    windows = [{"t": t, "output_tok_s": 50.0, "rss_bytes": 900_000_000, "outage": False,
                "device_allocated_bytes": 2_000_000_000 + 1000 * t, "device_max_allocated_bytes": 2_100_000_000}
               for t in (10.0, 20.0, 30.0)]
    job = JobFactory(spec={"stages": ["serve", "soak"], "dtype": "bfloat16"})
    do_record_stage_results(job, {"soak": {**SOAK, "windows": windows,
                                           "device_memory": {"source": "torch.cuda",
                                                             "memory_slope": 1000.0}}})
    html = _page(client, job)
    assert html.count("<polyline") == 3 and 'id="soak-device-memory"' in html
    assert "device memory allocated over time (min 1907, max 1907 MiB" in _text(html, "soak-device-memory")
    assert "slope 1000 B/s" in _text(html, "soak-device-note")
    cpu_windows = [{**w, "device_allocated_bytes": None, "device_max_allocated_bytes": None} for w in windows]
    cpu = JobFactory(spec={"stages": ["serve", "soak"], "dtype": "bfloat16"})
    note = "no device memory on CPU: the server's memory is its process RSS (rss_bytes)"
    do_record_stage_results(cpu, {"soak": {**SOAK, "windows": cpu_windows,
                                           "device_memory": {"source": "cpu: process RSS", "note": note}}})
    html = _page(client, cpu)
    assert html.count("<polyline") == 2 and 'id="soak-device-memory"' not in html
    assert "cpu: process RSS" in _text(html, "soak-device-note") and "its process RSS" in html


def test_the_job_page_lists_a_multi_node_jobs_nodes_with_their_agents_and_states(client) -> None:
    from apps.fleet.models import Agent

    job = JobFactory(nodes=2)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    assert "No nodes reserved yet: the job waits for 2 free agents" in page
    agents = [Agent.objects.create(hardware=job.hardware, hostname=f"gpu-host-{i}") for i in range(2)]
    for attempt, state in ((1, NodeState.FAILED), (2, NodeState.RUNNING)):  # the newest attempt is shown
        for rank, agent in enumerate(agents):
            JobNode.objects.create(job=job, attempt=attempt, rank=rank, agent=agent, master_addr="10.0.0.1",
                                   master_port=31000 + attempt,
                                   state=state if rank == 0 or state != NodeState.RUNNING else NodeState.RESERVED)
    page = client.get(f"/jobs/{job.pk}/").content.decode()
    rows = re.findall(r'<tr data-node-rank="(\d)" data-node-state="(\w+)">', page)
    assert rows == [("0", "running"), ("1", "reserved")]
    nodes = _text(page, "job-nodes")
    assert "2 hosts · attempt 2" in nodes and "10.0.0.1:31002" in nodes
    assert "gpu-host-0" in nodes and "gpu-host-1" in nodes
    one = JobFactory()
    assert 'id="job-nodes"' not in client.get(f"/jobs/{one.pk}/").content.decode()


def test_the_comparison_of_two_runs_shows_comm_overhead_jitter_and_expert_imbalance_b_over_a(client) -> None:
    a = JobFactory(spec={"stages": ["bench"], "dtype": "float32"})
    b = JobFactory(model=a.model, hardware=a.hardware, spec={"stages": ["bench"], "dtype": "float32"})
    do_record_stage_results(a, {"bench": _bench(moe=True)})
    slower = _bench(moe=True)
    for run in slower["runs"]:
        run["comm_overhead_ratio"] *= 2
    do_record_stage_results(b, {"bench": slower})
    html = client.get(f"/compare/?a={a.pk}&b={b.pk}").content.decode()
    rows = re.findall(r'<tr class="cmp-(\w*)"><td>([^<]+)</td>\s*<td class="num" data-label="A">([^<]+)</td>', html)
    comm = [(verdict, value.strip()) for verdict, label, value in rows if label == "comm overhead (rank 0)"]
    assert comm == [("worse", "4.00 %"), ("worse", "5.00 %"), ("worse", "6.00 %")], comm
    assert [v for v, label, _ in rows if label == "TPOT jitter p99/p50"] == ["same"] * 3
    assert [v for v, label, _ in rows if label == "expert max/mean"] == ["same"] * 3
    assert "▲ ×2.00" in html


def test_the_cell_api_serves_the_runtime_evidence_the_page_shows_within_its_schema(client, api_schema) -> None:  # noqa: F811
    from schemathesis.specs.openapi.checks import response_schema_conformance

    from apps.accounts.access import Actor
    from apps.dashboards.selectors.cell import cell_page

    job = JobFactory(spec={"stages": ["serve", "align", "bench", "soak"], "dtype": "bfloat16",
                           "bench": {"compile": True}})
    windows = [{"t": t, "output_tok_s": 50.0, "rss_bytes": 900_000_000, "outage": False,
                "device_allocated_bytes": 2_000_000_000 + 1000 * int(t), "device_max_allocated_bytes": 2_100_000_000}
               for t in (10.0, 20.0, 30.0)]
    do_record_stage_results(job, {
        "serve": {**passing("serve"), "compile": SERVE_COMPILE},
        "align": {**passing("align"), "compile": _align_compile(diverge=True)},
        "bench": {**_bench(moe=True), "compile": BENCH_COMPILE},
        "soak": {**SOAK, "windows": windows, "device_memory": {"source": "torch.cuda", "memory_slope": 1000.0}}})
    bare = JobFactory()
    # the answer conforms to the documented schema, with the evidence and without any (before the test client's
    # first request: it reconnects the signal that closes the connection the WSGI calls share)
    operation = api_schema["/api/v1/cells/{model}/{hardware}/"]["GET"]
    for cell in (job, bare):
        operation.Case(path_parameters={"model": cell.model.slug, "hardware": cell.hardware.slug}).call_and_validate(
            checks=[response_schema_conformance])
    url = f"/api/v1/cells/{job.model.slug}/{job.hardware.slug}/"
    evidence = client.get(url).json()["runtime_evidence"]

    compiled = evidence["compiled_path"]
    assert compiled["jobs"] == {"serve": job.pk, "bench": job.pk, "align": job.pk}
    serve_rows = {r["label"]: r["value"] for r in compiled["serve"]["rows"]}
    assert serve_rows["compile seconds"] == 41.5 and serve_rows["FX graph cache"] == "3 hits · 1 miss"
    assert serve_rows["server ready"] == "55.2 s" and compiled["serve"]["enabled"] is True
    assert compiled["bench"]["compiled_tok_s"] == 420.0 and compiled["bench"]["speedup"] == 1.4
    assert compiled["align"]["match_rate"] == 0.8 and compiled["align"]["equal"] is False
    assert compiled["align"]["first"]["prompt"] == 1 and compiled["align"]["divergences"] == 1

    runs = evidence["bench_runs"]
    assert evidence["bench_job"] == job.pk and [r["concurrency"] for r in runs] == [1, 4, 16]
    assert [r["comm_overhead_ratio"] for r in runs] == [0.04, 0.05, 0.06]
    assert runs[0]["comm_overhead_ratio_per_rank"] == [0.04, 0.09] and runs[0]["comm_overhead_ratio_max"] == 0.09
    assert {r["tpot_jitter"] for r in runs} == {1.58} and not any(r["long_context"] for r in runs)
    balance = runs[0]["expert_balance"]
    assert balance["max_over_mean"] == 1.37 and balance["tokens_per_ep_rank"] == [810, 790]
    assert balance["tokens_per_expert"] == BALANCE["tokens_per_expert"] and "expert_bars" not in balance

    memory = evidence["soak_device_memory"]
    assert memory["source"] == "torch.cuda" and memory["memory_slope"] == 1000.0 and memory["job"] == job.pk
    assert [w["allocated_bytes"] for w in memory["windows"]] == [2_000_010_000, 2_000_020_000, 2_000_030_000]
    assert memory["min_bytes"] == 2_000_010_000 and memory["max_bytes"] == 2_000_030_000

    # the page reads the same selectors: its compiled card and bench rows are the API's, less the SVG bars
    page = cell_page(Actor(is_staff=True), job.model.slug, job.hardware.slug)
    assert [{**r, "long_context": False,
             "expert_balance": {k: v for k, v in r["expert_balance"].items() if k != "expert_bars"}}
            for r in page.bench_extras] == runs
    assert [list(row) for row in page.compiled["serve"]["rows"]] == [[r["label"], r["value"]]
                                                                    for r in compiled["serve"]["rows"]]
    html = _page(client, job)
    assert "slope 1000 B/s" in _text(html, "soak-device-note") and "max 1907 MiB" in html
    assert client.get(f"/api/v1/cells/{bare.model.slug}/{bare.hardware.slug}/").json()["runtime_evidence"] == {
        "compiled_path": None, "bench_job": None, "bench_runs": [], "soak_device_memory": None}
