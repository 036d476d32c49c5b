"""Ranks across hosts (torchrun convention): two "nodes" on loopback, each a process running its local ranks
(gloo, master 127.0.0.1), serve one tiny model with greedy outputs equal to one process; a node that never comes
ends the rendezvous with an error naming it, never a hang."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agents.runtime.distributed import free_port, launch
from agents.runtime.nodes import NodeSpec, node_layout_problem
from agents.runtime.testing.make_model import cached_model
from tests.runtime.served import wait_until_ready

REPO = Path(__file__).resolve().parents[2]


def _serve(model_dir: Path, node_rank: int, master_port: int, http_port: int, log: Path,
           *extra: str) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "day0cli", "serve", str(model_dir), "--pp", "2", "--num-blocks", "32",
           "--port", str(http_port), "--nnodes", "2", "--node-rank", str(node_rank), "--master-addr", "127.0.0.1",
           "--master-port", str(master_port), *extra]
    return subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=REPO)


def test_two_nodes_on_loopback_serve_the_single_process_greedy_tokens(tmp_path):
    from agents.runtime.engine import LLMEngine, SamplingParams

    model_dir = cached_model("llama")
    prompts = ["Hello world, this is a test of", "The quick brown fox"]
    alone = LLMEngine(model_dir, num_blocks=32).generate(
        prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    master, http = free_port(), free_port()
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    nodes = [_serve(model_dir, r, master, http, logs[r], "--rendezvous-timeout", "120") for r in (0, 1)]
    url = f"http://127.0.0.1:{http}"
    try:
        wait_until_ready(url, nodes[0], logs[0], timeout=180)
        assert nodes[1].poll() is None, logs[1].read_text()[-3000:]
        for prompt, expected in zip(prompts, alone, strict=True):
            r = httpx.post(f"{url}/v1/completions", timeout=60,
                           json={"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["text"] == expected.text
    finally:
        nodes[0].terminate()
        codes = [p.wait(timeout=60) for p in nodes]  # node 1's worker rank ends when rank 0 does
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]


def _all_reduce_rank() -> float:
    import torch
    import torch.distributed as dist

    x = torch.ones(1)
    dist.all_reduce(x)
    return float(x.item())


def test_a_node_that_never_comes_ends_the_rendezvous_naming_it():
    started = time.monotonic()
    node0 = NodeSpec(nnodes=2, node_rank=0, master_addr="127.0.0.1", master_port=free_port(), timeout=2)
    with pytest.raises(RuntimeError, match=r"timed out after 2 s: node 1 \(rank 1\) of 2 node\(s\) never joined"):
        launch(_all_reduce_rank, 2, tp_size=1, pp_size=2, node=node0, timeout=60)
    assert time.monotonic() - started < 45  # spawn + 2 s, not the 300 s default or a hang


def test_a_node_without_a_master_says_it_cannot_reach_it():
    node1 = NodeSpec(nnodes=2, node_rank=1, master_addr="127.0.0.1", master_port=free_port(), timeout=2)
    with pytest.raises(RuntimeError, match=r"node 1 \(rank 1\) could not reach the rendezvous master 127\.0\.0\.1"):
        launch(_all_reduce_rank, 2, tp_size=1, pp_size=2, node=node1, timeout=60)


def test_node_flags_are_checked_and_name_what_is_wrong():
    with pytest.raises(ValueError, match="node rank 2 is outside the 2 node"):
        NodeSpec(nnodes=2, node_rank=2)
    with pytest.raises(ValueError, match="master port"):
        NodeSpec(nnodes=2, master_port=70000)
    with pytest.raises(ValueError, match="master address"):
        NodeSpec(nnodes=2, master_addr="bad host")
    with pytest.raises(ValueError, match="do not split over 2 nodes"):
        NodeSpec(nnodes=2).local_world(3)
    node = NodeSpec(nnodes=2, node_rank=1)
    assert list(node.global_ranks(4)) == [2, 3] and node.node_of(1, 4) == 0
    assert NodeSpec(nnodes=2, node_rank=1, master_port=29500).with_port(3).master_port == 29503


def test_a_multi_node_layout_is_held_to_the_planners_whole_node_rule():
    config = json.loads((cached_model("llama") / "config.json").read_text())
    two = NodeSpec(nnodes=2)
    assert node_layout_problem(config, 1, 2, 1, two) is None  # PP spans the nodes
    assert node_layout_problem(config, 2, 2, 1, two) is None  # TP inside each node of 2 ranks
    assert "must stay inside a node" in node_layout_problem(config, 2, 1, 1, two)  # TP across the nodes
    assert "do not split over 2 nodes" in node_layout_problem(config, 1, 1, 1, two)


def test_day0_serve_refuses_a_layout_that_breaks_the_node_rule(tmp_path):
    out = subprocess.run([sys.executable, "-m", "day0cli", "serve", str(cached_model("llama")), "--tp", "2",
                          "--nnodes", "2", "--node-rank", "0"], capture_output=True, text=True, cwd=REPO,
                         timeout=120)
    assert out.returncode == 2 and "tp=2 must stay inside a node" in out.stdout, out.stdout + out.stderr


def test_a_fallback_model_takes_no_degree_above_one_on_one_host_or_several():
    config = json.loads((cached_model("qwen2-vl") / "config.json").read_text())  # the transformers fallback
    one, two = NodeSpec(), NodeSpec(nnodes=2)
    assert node_layout_problem(config, 1, 1, 1, one) is None
    for tp, pp, ep, flag in ((2, 1, 1, "tp=2"), (1, 2, 1, "pp=2"), (1, 1, 2, "ep=2")):
        problem = node_layout_problem(config, tp, pp, ep, one)
        assert problem.startswith(f"{flag} cannot run: ") and "runs on one device only" in problem, problem
    assert "runs on one device only" in node_layout_problem(config, 1, 2, 1, two)  # before the node split
    with pytest.raises(ValueError, match="architectures"):
        node_layout_problem({"hidden_size": 8}, 2, 1, 1, one)


def test_day0_serve_refuses_tp_2_on_a_fallback_model_before_loading_it(tmp_path):
    model_dir = tmp_path / "config-only"  # no weights: a server that got past the check would fail loading
    model_dir.mkdir()
    (model_dir / "config.json").write_text((cached_model("qwen2-vl") / "config.json").read_text())
    out = subprocess.run([sys.executable, "-m", "day0cli", "serve", str(model_dir), "--tp", "2"],
                         capture_output=True, text=True, cwd=REPO, timeout=120)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "tp=2 cannot run: architecture" in out.stdout and "the transformers fallback runs on one device only" \
        in out.stdout, out.stdout


@pytest.mark.slow  # two nodes run load, serve and the comm sweep: ~95 s on a busy host
def test_day0_adapt_over_two_nodes_runs_the_ranked_stages_and_node_0_reports_every_rank(tmp_path):
    model_dir, master = cached_model("llama"), free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "day0cli", "adapt", str(model_dir), "--hardware", "cpu", "--pp", "2",
         "--stages", "plan,load,serve,comm", "--nnodes", "2", "--node-rank", str(r), "--master-port", str(master),
         "--rendezvous-timeout", "120", "--workdir", str(tmp_path / f"n{r}"), "--report", str(tmp_path / f"r{r}.json")],
        stdout=(tmp_path / f"n{r}.log").open("w"), stderr=subprocess.STDOUT, env=env, cwd=REPO) for r in (0, 1)]
    codes = [p.wait(timeout=500) for p in procs]
    assert codes == [0, 0], [(tmp_path / f"n{r}.log").read_text()[-3000:] for r in (0, 1)]
    report = json.loads((tmp_path / "r0.json").read_text())
    assert report["failed_stage"] is None and report["tier"] >= 3
    assert [r["rank"] for r in report["stages"]["load"]["ranks"]] == [0, 1]  # node 1's rank, gathered
    comm = report["stages"]["comm"]
    assert comm["ranks"] == 2 and comm["nnodes"] == 2 and all(c["ok"] for c in comm["collectives"])
    follower = json.loads((tmp_path / "r1.json").read_text())
    assert follower["node"] == 1 and all(s["ok"] for s in follower["stages"].values())
    assert set(follower["stages"]) == {"load", "serve", "comm"}


def test_day0_adapt_refuses_node_flags_that_break_the_rules(tmp_path):
    out = subprocess.run([sys.executable, "-m", "day0cli", "adapt", str(cached_model("llama")), "--hardware",
                          "cpu", "--nnodes", "2", "--node-rank", "1", "--tp", "2"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 2 and "--nnodes 2: tp=2 must stay inside a node" in out.stderr, out.stdout + out.stderr
    out = subprocess.run([sys.executable, "-m", "day0cli", "adapt", str(cached_model("llama")), "--hardware",
                          "cpu", "--nnodes", "2", "--node-rank", "2", "--pp", "2"], capture_output=True, text=True,
                         cwd=REPO, timeout=120)
    assert out.returncode == 2 and "node rank 2 is outside the 2 node" in out.stderr, out.stdout + out.stderr


@pytest.mark.slow  # two nodes load the model and serve: ~25 s on a busy host
def test_a_rank_failing_on_another_node_is_named_on_node_0(tmp_path):
    model_dir, master, http = cached_model("llama"), free_port(), free_port()
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    os.environ["DAY0_INJECT_RANK_FAULT"] = "1:4"  # rank 1 is node 1's; steps 1-2 warm up, 4 is in the request
    try:
        nodes = [_serve(model_dir, r, master, http, logs[r], "--rendezvous-timeout", "120") for r in (0, 1)]
    finally:
        del os.environ["DAY0_INJECT_RANK_FAULT"]
    url = f"http://127.0.0.1:{http}"
    try:
        wait_until_ready(url, nodes[0], logs[0], timeout=180)
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": "Hello world", "max_tokens": 12,
                                                           "ignore_eos": True}, timeout=60)
        codes = [p.wait(timeout=60) for p in nodes]  # both nodes stop by themselves
    finally:
        for p in nodes:
            if p.poll() is None:
                p.kill()
    expected = "rank 1: InjectedFault: fault injected on rank 1 at step 4"
    assert expected in answer.text and "abandoned on every rank" in answer.text, answer.text
    assert codes == [1, 1], [log.read_text()[-2000:] for log in logs]
    assert expected in logs[0].read_text()  # node 0's own log names the other host's rank


@pytest.mark.slow  # four ranks on two nodes load a MoE model: ~40 s on a busy host
def test_tp2_inside_each_of_two_nodes_pp_across_them_serves_the_single_process_tokens(tmp_path):
    from agents.runtime.engine import LLMEngine, SamplingParams

    model_dir, master, http = cached_model("qwen3-moe"), free_port(), free_port()
    prompt = "Hello world, this is"
    [alone] = LLMEngine(model_dir, num_blocks=32).generate(
        [prompt], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    nodes = [_serve(model_dir, r, master, http, logs[r], "--tp", "2", "--rendezvous-timeout", "120") for r in (0, 1)]
    url = f"http://127.0.0.1:{http}"
    try:
        wait_until_ready(url, nodes[0], logs[0], timeout=240)
        r = httpx.post(f"{url}/v1/completions", timeout=60,
                       json={"prompt": prompt, "max_tokens": 8, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == alone.text, r.text
        assert len(httpx.get(f"{url}/stats/experts", timeout=30).json()["counts"]) == 2  # both stages' layers
    finally:
        nodes[0].terminate()
        codes = [p.wait(timeout=60) for p in nodes]
    assert codes == [0, 0], [log.read_text()[-2000:] for log in logs]
