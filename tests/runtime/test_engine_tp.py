"""``day0 serve --tp 2``: two gloo ranks on this host, rank 0 serving HTTP; greedy outputs equal one process."""

from __future__ import annotations

import os
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
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "day0portal.cli",
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
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
        log.close()
