"""The bench stage on vLLM through vLLM's own client: ``vllm bench serve`` (the engine's executable, the one the
agent advertises for ``vllm``) once per concurrency level of the same workload the runtime's client runs
(random token-id prompts of ``input_len``, ``output_len`` tokens with EOS ignored, greedy), its saved JSON result
parsed into the bench section's run shape (``to_run``). A level that finishes its prompts in less than
``min_seconds`` is run again with proportionally more prompts (vLLM's client has no time-based top-up), and the
longer run is the level's. The repeated-prompt probe stays the runtime client's (``vllm bench serve`` has no
mode alternating one repeated prompt with fresh ones over the same seconds): ``probe.client`` says so."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import httpx

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.engine_process import EngineProcess, agent_engine_path, engine_env
from agents.pipeline.support.errors import StageFailed
from agents.runtime.bench.metrics import jitter

CLIENT = "vllm bench serve"
PERCENTILES = ("50", "90", "99")
METRICS = {"ttft_ms": "ttft", "tpot_ms": "tpot", "itl_ms": "itl", "e2e_ms": "e2el"}
MAX_TOPUP_PROMPTS = 4096  # a level's re-run never asks more prompts than this
LEVEL_TIMEOUT_S = 1800.0


def vllm_client(ctx: StageContext, server: Any) -> str | None:
    """The ``vllm`` executable whose ``bench serve`` measures this job, or None (the runtime's client): only for
    the vLLM engine's own server, the agent's configured path for ``vllm`` else the engine's executable on PATH;
    ``bench.client: "day0"`` asks for the runtime's client anyway."""
    engine = ctx.engine or {}
    if ctx.bench.get("client") == "day0" or engine.get("name") != "vllm" or not isinstance(server, EngineProcess):
        return None
    configured = agent_engine_path("vllm")
    if configured and Path(configured).exists():
        return configured
    return shutil.which(str(engine.get("executable") or "vllm"))


def bench_argv(exe: str, url: str, model: str, tokenizer: Path, *, concurrency: int, num_prompts: int,
               input_len: int, output_len: int, seed: int, request_rate: float | None, result_dir: Path,
               filename: str) -> list[str]:
    """``vllm bench serve``'s command line for one level: random token prompts, EOS ignored, greedy, the result
    saved with its per-request detail."""
    return [exe, "bench", "serve", "--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", model, "--tokenizer", str(tokenizer), "--dataset-name", "random",
            "--random-input-len", str(input_len), "--random-output-len", str(output_len),
            "--random-range-ratio", "0", "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency),
            "--request-rate", "inf" if request_rate is None else f"{float(request_rate):g}", "--ignore-eos",
            "--temperature", "0", "--seed", str(seed), "--disable-tqdm", "--percentile-metrics", "ttft,tpot,itl,e2el",
            "--metric-percentiles", ",".join(PERCENTILES), "--ready-check-timeout-sec", "60", "--save-result",
            "--save-detailed", "--result-dir", str(result_dir), "--result-filename", filename]


def _ms(value: Any) -> float | None:
    return round(float(value), 3) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def to_run(result: dict[str, Any], concurrency: int, seed: int) -> dict[str, Any]:
    """One ``runs`` entry of the bench section from ``vllm bench serve``'s saved result (``--save-detailed``,
    ``--metric-percentiles 50,90,99``): its own percentiles and means (vLLM interpolates p99, so
    ``p99_is_max`` is empty), counts and rates, and the samples behind them from the per-request detail."""
    completed, failed = int(result.get("completed") or 0), int(result.get("failed") or 0)
    stats = {key: {"mean": _ms(result.get(f"mean_{name}_ms")),
                   **{f"p{p}": _ms(result.get(f"p{p}_{name}_ms")) for p in PERCENTILES}}
             for key, name in METRICS.items()}
    out_lens = [n for n in result.get("output_lens") or [] if isinstance(n, int)]
    itls = [x for x in result.get("itls") or [] if isinstance(x, list)]
    duration = float(result.get("duration") or 0.0)
    return {
        "concurrency": concurrency, "seed": seed,
        "prompts": completed + failed, "completed": completed, "failed": failed,
        "duration_s": round(duration, 3),
        "samples": {"ttft_ms": completed, "tpot_ms": sum(1 for n in out_lens if n > 1),
                    "itl_ms": sum(len(x) for x in itls), "e2e_ms": completed},
        "p99_is_max": [],
        **stats,
        "tpot_jitter": jitter(stats["tpot_ms"]),
        "input_tokens": int(result.get("total_input_tokens") or 0),
        "output_tokens": int(result.get("total_output_tokens") or 0),
        "output_tok_s": round(float(result.get("output_throughput") or 0.0), 3),
        "req_s": round(float(result.get("request_throughput") or 0.0), 3),
        "errors": sorted({str(e)[:300] for e in result.get("errors") or [] if e})[:5],
    }


class VllmBench:
    """``vllm bench serve`` against one server, a saved result per level under ``workdir/vllm-bench``."""

    def __init__(self, ctx: StageContext, exe: str, server: EngineProcess) -> None:
        self.ctx, self.exe, self.url = ctx, exe, server.url
        self.model = server.served_model()
        if not self.model:
            raise StageFailed(f"vllm bench serve: {server.url}/v1/models names no served model")
        self.env = engine_env(ctx.engine or {})
        self.dir = Path(ctx.workdir) / "vllm-bench"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.count = 0

    def level(self, **kwargs: Any) -> dict[str, Any]:
        """One ``vllm bench serve`` run: its saved JSON result (a failure raises StageFailed with its log tail)."""
        self.count += 1
        name = f"level-{self.count}.json"
        argv = bench_argv(self.exe, self.url, self.model, Path(self.ctx.model_dir), result_dir=self.dir,
                          filename=name, **kwargs)
        log = self.dir / f"level-{self.count}.log"
        self.ctx.emit("log", "$ " + " ".join(argv))
        with open(log, "w") as out:
            try:
                done = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=self.env,
                                      timeout=LEVEL_TIMEOUT_S, start_new_session=True)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise StageFailed(f"{CLIENT} could not run: {exc}") from exc
        saved = self.dir / name
        if done.returncode != 0 or not saved.exists():
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise StageFailed(f"{CLIENT} exited with code {done.returncode} at concurrency "
                              f"{kwargs['concurrency']}; its log ends:\n{tail}")
        return json.loads(saved.read_text())


def run_vllm_benchmark(ctx: StageContext, exe: str, server: EngineProcess, settings: dict[str, Any],
                       probe_section: Any) -> dict[str, Any]:
    """The bench section measured by ``vllm bench serve``: the sweep (each level topped up to ``min_seconds``),
    the long-context case when asked and the model's context allows, and the runtime client's probe
    (``probe_section(concurrency)``: the runtime's section of one level with its probe)."""
    if int(settings.get("images_per_request") or 0):
        raise StageFailed(f"{CLIENT}: images_per_request is measured by the runtime's client (bench.client: day0)")
    bench = VllmBench(ctx, exe, server)
    seed, rate = int(settings.get("seed") or 0), settings.get("request_rate")
    input_len, output_len = int(settings["input_len"]), int(settings["output_len"])
    num, min_seconds = int(settings["num_prompts"]), float(settings.get("min_seconds") or 0.0)
    runs = []
    for index, conc in enumerate(settings["concurrency"]):
        asked = {"concurrency": int(conc), "num_prompts": num, "input_len": input_len, "output_len": output_len,
                 "seed": seed + index, "request_rate": rate}
        result = bench.level(**asked)
        duration = float(result.get("duration") or 0.0)
        if min_seconds and 0 < duration < min_seconds:  # too short for a baseline: again, with more prompts
            more = min(MAX_TOPUP_PROMPTS, math.ceil(num * min_seconds / duration * 1.25))
            result = bench.level(**{**asked, "num_prompts": more})
        runs.append(to_run(result, int(conc), seed + index))
    long_run = None
    max_len = _max_model_len(server.url)
    if settings.get("long_context") and max_len:
        long_in = min(int(settings.get("long_input_len") or max_len), max_len - output_len - 1)
        if long_in > input_len:
            result = bench.level(concurrency=1, num_prompts=2, input_len=long_in, output_len=output_len,
                                 seed=seed + len(runs), request_rate=None)
            long_run = {**to_run(result, 1, seed + len(runs)), "input_len": long_in}
    probe = probe_section(max(settings["concurrency"]))
    if probe is not None:
        probe = {**probe, "client": "day0 (agents.runtime.bench)"}
    return {
        "endpoint": server.url, "model": bench.model, "input_len": input_len, "output_len": output_len,
        "num_prompts": num, "request_rate": rate, "images_per_request": 0,
        "prompts": {"kind": "random token ids", "dataset": "vllm bench serve --dataset-name random"},
        "requested": {"concurrency": list(settings["concurrency"]), "num_prompts": num, "input_len": input_len,
                      "output_len": output_len, "ignore_eos": True, "min_seconds": min_seconds,
                      "request_rate": rate},
        "runs": runs, "probe": probe, "long_context": long_run, "peak_memory_bytes": None, "expert_load": None,
        "client": f"{CLIENT} ({exe})", "client_results": str(bench.dir),
    }


def _max_model_len(url: str) -> int | None:
    try:
        card = httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None
    value = card.get("max_model_len") if isinstance(card, dict) else None
    return value if isinstance(value, int) else None
