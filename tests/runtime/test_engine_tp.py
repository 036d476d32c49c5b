"""``day0 serve --tp 2``: two gloo ranks on this host, rank 0 serving HTTP; greedy outputs equal one process, and
the ranks split the host's CPUs, each rank's compute threads pinned to its own share."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.server.launcher import free_port
from agents.runtime.testing.make_model import cached_model

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # two processes load the model: ~15-20 s on a busy host
def test_tensor_parallel_server_matches_a_single_process(tmp_path):
    model_dir = cached_model("llama")
    prompts = ["Hello world, this is a test of", "The quick brown fox"]
    alone = LLMEngine(model_dir, num_blocks=64).generate(
        prompts, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
    )
    port = free_port()
    log = open(tmp_path / "serve.log", "w")
    allowed = sorted(os.sched_getaffinity(0))
    threads = min(2, len(allowed))  # the server's threads: one CPU a rank where the host has two
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": str(threads)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "day0cli",
            "serve",
            str(model_dir),
            "--tp",
            "2",
            "--port",
            str(port),
            "--num-blocks",
            "64",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"{url}/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        assert proc.poll() is None, (tmp_path / "serve.log").read_text()[-2000:]
        for prompt, expected in zip(prompts, alone, strict=True):
            r = httpx.post(
                f"{url}/v1/completions",
                json={"prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True},
                timeout=60,
            )
            assert r.status_code == 200 and r.json()["choices"][0]["text"] == expected.text
        text = (tmp_path / "serve.log").read_text()
        ranks = {int(m[0]): (int(m[1]), [int(c) for c in m[2].split(",")], m[3]) for m in re.findall(
            r"rank (\d) of 2 on this host \(pid (\d+)\): 1 compute threads, CPUs ([\d,]+)(.*)", text)}
        assert sorted(ranks) == [0, 1], text[-3000:]
        if threads == 2:  # each rank its own CPU, and its compute thread pinned there (the others float)
            assert ranks[0][1] == [allowed[0]] and ranks[1][1] == [allowed[1]] and not ranks[0][2].strip()
            for pid, share, _ in ranks.values():
                masks = []
                for task in os.listdir(f"/proc/{pid}/task"):
                    with open(f"/proc/{pid}/task/{task}/status") as fh:
                        masks.append(next(x for x in fh if x.startswith("Cpus_allowed_list")).split()[1])
                assert str(share[0]) in masks and len(set(masks)) > 1, masks
        else:  # one CPU: shared by both ranks, never pinned
            assert all("shared" in extra for _, _, extra in ranks.values())
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        log.close()
