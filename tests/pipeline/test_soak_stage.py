"""The soak stage on the tiny Llama: a real ``day0 serve`` under mixed load with abnormal requests, killed
once and restarted by the stage's supervisor; a planted leak and a server that does not come back fail it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from agents.pipeline.stages import soak
from agents.pipeline.support.context import StageContext
from agents.runtime.testing.make_model import cached_model

FAULTS = Path(__file__).parent / "soak_faults"
# 2 shared CPU cores in CI: throughput per window is noisy, so the passing run asks 50 % (the default is 95 %)
BASE = {"seconds": 40.0, "window_seconds": 5.0, "concurrency": 2, "max_tokens": 8, "abnormal_every": 3,
        "kill_at": 0.2, "recover_timeout": 120.0, "min_throughput_ratio": 0.5}


def _ctx(tmp_path: Path, **soak_options) -> StageContext:
    model_dir = cached_model("llama")
    return StageContext(model_dir=model_dir, config=json.loads((model_dir / "config.json").read_text()),
                        hardware={"slug": "cpu"}, workdir=tmp_path, emit_fn=lambda *a, **k: None,
                        bench={"soak": {**BASE, **soak_options}})


@pytest.mark.slow
def test_soak_passes_on_the_tiny_model_and_recovers_from_the_injected_kill(tmp_path) -> None:
    section = soak.run(_ctx(tmp_path))
    assert section["passed"], section["reasons"]
    assert section["crashes"] == 0 and 0 < section["recover_seconds"] < 120
    assert [e["injected"] for e in section["injected"]] == [True]
    assert any(w["outage"] for w in section["windows"]) or section["recover_seconds"] < BASE["window_seconds"]
    assert all(v["sent"] > 0 and v["refused_cleanly"] == v["sent"] for v in section["abnormal"].values())
    assert section["requests"] > 0 and all(w["rss_bytes"] for w in section["windows"] if not w["outage"])
    assert {"seconds", "passed", "windows", "memory_slope", "crashes", "recover_seconds"} <= set(section)


@pytest.mark.slow
def test_a_planted_leak_fails_on_the_memory_slope(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(FAULTS))
    monkeypatch.setenv("DAY0_TEST_LEAK_BYTES", str(8 * 1024 * 1024))
    section = soak.run(_ctx(tmp_path, kill_at=None, seconds=20.0, min_throughput_ratio=0.0))
    assert not section["passed"]
    assert section["memory_slope"] > soak.DEFAULTS["max_memory_slope"]
    assert any("memory grows" in r for r in section["reasons"]), section["reasons"]


@pytest.mark.slow
def test_a_server_that_does_not_come_back_fails(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(FAULTS))
    monkeypatch.setenv("DAY0_TEST_NO_RESTART", str(tmp_path / "started-once"))
    section = soak.run(_ctx(tmp_path, seconds=20.0, recover_timeout=10.0))
    assert not section["passed"] and section["recover_seconds"] is None
    assert any("did not come back" in r for r in section["reasons"]), section["reasons"]


def test_memory_slope_is_the_least_squares_fit() -> None:
    assert soak.memory_slope([(0.0, 100), (1.0, 300), (2.0, 500)]) == pytest.approx(200.0)
    assert soak.memory_slope([(0.0, 100)]) == 0.0


def test_soak_options_are_bounded_naming_the_key() -> None:
    from agents.pipeline.support.errors import StageFailed

    for options, words in (({"seconds": 0}, "seconds"), ({"kill_at": 2}, "kill_at"), ({"bogus": 1}, "bogus"),
                           ({"seconds": 5, "window_seconds": 10}, "window_seconds"), ("x", "object"),
                           ({"concurrency": True}, "concurrency")):
        with pytest.raises(StageFailed, match=words):
            soak.soak_settings(options)
    assert soak.soak_settings(None) == soak.DEFAULTS


def _judged(device: dict) -> dict:
    sup = soak.Supervisor(ctx=None, recover_timeout=10.0)
    windows = [{"t": float(t), "output_tok_s": 10.0, "rss_bytes": 1, "outage": False} for t in range(4)]
    samples = {0: [(float(t), 1000) for t in range(8)]}
    settings = {**soak.DEFAULTS, "kill_at": None}
    return soak.judge(settings, windows, samples, sup, soak.Tally(), 1.0, 4.0, device)


def test_growing_device_memory_fails_like_resident_memory() -> None:
    flat = _judged({"source": "torch.cuda", "samples": {0: [(float(t), 5 << 30) for t in range(8)]}})
    assert flat["passed"] and flat["device_memory"] == {"source": "torch.cuda", "memory_slope": 0.0}
    leak = _judged({"source": "torch.cuda", "samples": {0: [(float(t), t * (64 << 20)) for t in range(8)]}})
    assert not leak["passed"] and any("device memory grows" in r for r in leak["reasons"]), leak["reasons"]


def test_on_cpu_the_server_says_its_memory_is_the_process_rss() -> None:
    from agents.runtime.engine import LLMEngine
    from agents.runtime.server.app import create_app
    from agents.runtime.server.launcher import ServerThread

    engine = LLMEngine(cached_model("llama"), num_blocks=16)
    with ServerThread(create_app(engine, "tiny")) as url:
        for _ in range(100):  # the warm-up step runs before /ready
            if httpx.get(f"{url}/ready").status_code == 200:
                break
            time.sleep(0.1)
        memory = soak.device_memory(url)
        compile_stats = httpx.get(f"{url}/stats/compile").json()
    assert memory["source"] == "cpu: process RSS" and memory["rss_bytes"] > 0 and "allocated_bytes" not in memory
    assert soak._device_row(memory) == {"device_allocated_bytes": None, "device_max_allocated_bytes": None}
    assert compile_stats["enabled"] is False and "--compile" in compile_stats["reason"]
    judged = _judged({"source": memory["source"], "samples": {}})
    assert judged["device_memory"]["source"] == "cpu: process RSS" and "process RSS" in judged["device_memory"]["note"]
