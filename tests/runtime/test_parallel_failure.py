"""A rank failing mid-step never hangs a tensor-parallel server: the step is abandoned on every rank, the
request at fault gets an error naming the rank, and ``day0 serve --tp`` exits 1 with that rank's error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from agents.runtime.engine.rank_failure import InjectedFault, inject_fault, read_errors, record_error
from agents.runtime.server.launcher import free_port
from agents.runtime.testing.make_model import cached_model
from tests.runtime.served import wait_until_ready

REPO = Path(__file__).resolve().parents[2]


def test_fault_injection_names_rank_and_step(monkeypatch) -> None:
    monkeypatch.setenv("DAY0_INJECT_RANK_FAULT", "1:3")
    inject_fault(0, 3)
    inject_fault(1, 2)
    with pytest.raises(InjectedFault, match="rank 1 at step 3"):
        inject_fault(1, 3)
    monkeypatch.setenv("DAY0_INJECT_RANK_FAULT", "one")
    with pytest.raises(ValueError, match="RANK:STEP"):
        inject_fault(1, 3)


def test_errors_are_read_first_written_first(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DAY0_TP_ERROR_DIR", str(tmp_path))
    record_error(1, "rank 1: boom")
    time.sleep(0.01)
    record_error(0, "rank 0: stopped after rank 1: boom")
    assert list(read_errors().items()) == [(1, "rank 1: boom"), (0, "rank 0: stopped after rank 1: boom")]


def _serve_with_fault(tmp_path: Path, fault: str) -> tuple[httpx.Response | Exception, int, str]:
    port = free_port()
    log_path = tmp_path / "serve.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "DAY0_INJECT_RANK_FAULT": fault, "OMP_NUM_THREADS": "1"}
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "day0cli", "serve", str(cached_model("llama")), "--tp",
                                 "2", "--port", str(port), "--num-blocks", "64"], stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=REPO)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_ready(url, proc, log_path, timeout=180)
            try:
                answer: httpx.Response | Exception = httpx.post(
                    f"{url}/v1/completions", json={"prompt": "Hello world", "max_tokens": 12, "ignore_eos": True},
                    timeout=60)
            except httpx.HTTPError as exc:
                answer = exc
            code = proc.wait(timeout=60)  # never hangs: the server stops by itself
        finally:
            if proc.poll() is None:
                proc.kill()
    return answer, code, log_path.read_text()


@pytest.mark.slow  # two processes load the model: ~20 s on a busy host
@pytest.mark.parametrize("rank", [1, 0])
def test_a_rank_failing_mid_step_ends_the_request_and_the_server_with_its_error(tmp_path, rank) -> None:
    answer, code, log = _serve_with_fault(tmp_path, f"{rank}:4")  # step 1-2 warm up; 4 is inside the request
    expected = f"rank {rank}: InjectedFault: fault injected on rank {rank} at step 4"
    assert isinstance(answer, httpx.Response), answer
    assert answer.status_code >= 400 or "error" in answer.text, answer.text
    assert f"rank {rank}" in answer.text and "abandoned on every rank" in answer.text
    assert code == 1, log[-3000:]
    assert f"day0 serve: {expected}" in log, log[-3000:]
