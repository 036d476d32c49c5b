"""A multi-rank server's counters cover every rank: the communication overhead ratio is timed on each rank (its
collective time over its step time, per rank and the max), and under pipeline parallelism the expert load covers
the MoE layers of every stage, not only rank 0's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from agents.runtime.server.launcher import free_port
from agents.runtime.testing.make_model import cached_model
from tests.runtime.served import wait_until_ready

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_a_pp2_moe_server_reports_every_ranks_overhead_and_every_stages_experts(tmp_path):
    model_dir = cached_model("qwen3-moe")
    layers = json.loads((model_dir / "config.json").read_text())["num_hidden_layers"]
    port, log = free_port(), tmp_path / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "day0cli", "serve", str(model_dir), "--pp", "2",
                             "--num-blocks", "32", "--port", str(port)], stdout=log.open("w"),
                            stderr=subprocess.STDOUT, env=env, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, proc, log, timeout=180)
        before = httpx.get(f"{url}/stats/experts", timeout=30).json()["counts"]
        assert len(before) == layers  # stage 0's layer and stage 1's, each counted on its own rank
        assert httpx.post(f"{url}/stats/comm", json={"enabled": True}, timeout=30).status_code == 200
        r = httpx.post(f"{url}/v1/completions", timeout=60,
                       json={"prompt": "Hello world", "max_tokens": 6, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        scraped = [s for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=30).text)
                   for s in family.samples]  # while the timer runs: rank 0 gathers every rank's ratio
        assert sorted(s.labels["rank"] for s in scraped if s.name == "day0:comm_overhead_ratio") == ["0", "1"]
        assert [s.value for s in scraped if s.name == "vllm:request_success_total"] == [1.0]  # rank 0's alone
        assert {s.labels["layers"] for s in scraped if s.name == "day0:expert_load_max_over_mean"} == {"mean", "worst"}
        totals = httpx.post(f"{url}/stats/comm", json={"enabled": False}, timeout=30).json()
        ranks = totals["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        for rank in ranks:  # each rank timed its own sends and receives inside its own steps
            assert rank["steps"] >= 6 and rank["collectives"] > 0, ranks
            assert 0 < rank["comm_overhead_ratio"] < 1, ranks
        assert totals["comm_overhead_ratio_max"] == max(r["comm_overhead_ratio"] for r in ranks)
        assert totals["comm_overhead_ratio"] == ranks[0]["comm_overhead_ratio"]  # rank 0's, as before
        after = httpx.get(f"{url}/stats/experts", timeout=30).json()["counts"]
        grown = [sum(a) - sum(b) for a, b in zip(after, before, strict=True)]
        assert all(g > 0 for g in grown), grown  # the last stage's experts routed this request's tokens too
        off = httpx.get(f"{url}/stats/comm", timeout=30).json()
        assert off["enabled"] is False and all(r["enabled"] is False for r in off["ranks"])
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]


def test_a_rank_that_does_not_answer_is_named_within_the_bound(monkeypatch):
    from datetime import timedelta

    import torch.distributed as dist

    from agents.runtime.engine import tp

    port = free_port()
    server = dist.TCPStore("127.0.0.1", port, None, True, timeout=timedelta(seconds=10), wait_for_workers=False)
    monkeypatch.setattr(tp, "_STORE_AT", [("127.0.0.1", port)])
    stats = tp.RankStats(world=3, timeout=0.5)
    stats.store.set(f"{tp.STATS_PREFIX}/resp/1/1", "{}")  # rank 1 answers the first ask, rank 2 never does
    with pytest.raises(RuntimeError, match=r"^ranks \[2\] did not report their counters within 0\.5 s$"):
        stats.ask("snapshot")
    del server
