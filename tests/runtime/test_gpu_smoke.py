"""Device paths only a GPU shows (run by ``scripts/gpu_check.sh`` when a CUDA device is lent; skipped
without one): every native family against transformers on CUDA, the transformers fallback on CUDA, sampled and
greedy serving over HTTP with the engine on CUDA, and tensor parallelism over NCCL when two GPUs exist."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from agents.runtime.engine import LLMEngine, SamplingParams
from agents.runtime.testing.make_model import cached_model
from tests.runtime.served import wait_until_ready

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
REPO = Path(__file__).resolve().parents[2]
PROMPTS = [[5, 17, 42, 7, 99, 3], [11, 12, 13], [200, 100, 50, 25, 12, 6, 3, 1]]
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)


@pytest.fixture(autouse=True)
def _exact_fp32():
    """fp32 on both sides means fp32: no TF32 matmuls."""
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _reference_greedy(model_dir: Path, prompt: list[int], steps: int) -> tuple[list[int], list[list[int]]]:
    """transformers fp32 on CUDA: greedy tokens and each step's top-5."""
    from transformers import AutoModelForCausalLM

    ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval().to("cuda")
    ids, tops = list(prompt), []
    with torch.no_grad():
        for _ in range(steps):
            logits = ref(torch.tensor([ids], device="cuda")).logits[0, -1]
            tops.append(logits.topk(5).indices.tolist())
            ids.append(int(logits.argmax()))
    return ids[len(prompt):], tops


def _assert_aligned(ours: list[int], ref: list[int], ref_top5: list[list[int]]) -> None:
    """Equal greedy tokens; a divergence only on a near-tie (our token in the reference's top-5), after which
    the continuations differ legitimately."""
    for i, (a, b) in enumerate(zip(ours, ref, strict=True)):
        if a != b:
            assert a in ref_top5[i], f"token {i}: ours {a} not in the reference's top-5 {ref_top5[i]}"
            return


@pytest.mark.parametrize("arch", ["llama", "qwen3", "mixtral", "qwen3-moe", "deepseek-v3"])
def test_native_family_on_cuda_matches_transformers(arch):
    model_dir = cached_model(arch)
    engine = LLMEngine(model_dir, device="cuda", num_blocks=64, max_num_batched_tokens=16)
    assert next(engine.model.parameters()).device.type == "cuda"
    outs = engine.generate(PROMPTS, GREEDY)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ref, tops = _reference_greedy(model_dir, prompt, 8)
        _assert_aligned(out.output_token_ids, ref, tops)
    sampled = engine.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=1.0, top_k=20, top_p=0.9))
    assert all(o.finish_reason in ("length", "stop") for o in sampled)
    assert engine.stats()["kv_blocks_used"] == 0


def test_fallback_option_path_on_cuda(tmp_path):
    """A Llama with an activation the native MLP lacks runs on the transformers fallback, on CUDA."""
    src = cached_model("llama")
    model_dir = tmp_path / "gelu"
    shutil.copytree(src, model_dir)
    config = json.loads((src / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config, "hidden_act": "gelu"}))
    engine = LLMEngine(model_dir, device="cuda", num_blocks=32)
    assert engine.model.path == "fallback"
    out = engine.generate([PROMPTS[0]], GREEDY)[0]
    ref, tops = _reference_greedy(model_dir, PROMPTS[0], 8)
    _assert_aligned(out.output_token_ids, ref, tops)
    seeded = SamplingParams(max_tokens=6, temperature=0.8, seed=3)
    assert engine.generate([PROMPTS[1]], seeded)[0].output_token_ids == \
        engine.generate([PROMPTS[1]], seeded)[0].output_token_ids


def test_sampled_and_greedy_serving_on_cuda():
    from agents.runtime.server import create_app
    from agents.runtime.server.launcher import ServerThread

    model_dir = cached_model("llama")
    cpu = LLMEngine(model_dir, num_blocks=64).generate(["Hello world"], GREEDY)[0]
    engine = LLMEngine(model_dir, device="cuda", num_blocks=128)
    with ServerThread(create_app(engine, "tiny")) as url:
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/ready").status_code != 200 and time.monotonic() < deadline:
            time.sleep(0.1)
        greedy = httpx.post(f"{url}/v1/completions", json={"prompt": "Hello world", "max_tokens": 8,
                                                           "temperature": 0, "ignore_eos": True}, timeout=60)
        assert greedy.status_code == 200 and greedy.json()["choices"][0]["text"] == cpu.text
        # the server's default temperature is 1.0: every one of these samples on the device
        for body in ({"prompt": "Hello", "max_tokens": 8},
                     {"prompt": "Hello", "max_tokens": 8, "top_k": 5, "top_p": 0.8, "n": 3},
                     {"prompt": ["a", "b"], "max_tokens": 8, "seed": 11, "logprobs": 3, "echo": True}):
            r = httpx.post(f"{url}/v1/completions", json=body, timeout=60)
            assert r.status_code == 200, r.text
        seeded = {"prompt": "Hello", "max_tokens": 8, "seed": 7, "ignore_eos": True}
        first = httpx.post(f"{url}/v1/completions", json=seeded, timeout=60).json()["choices"][0]["text"]
        assert httpx.post(f"{url}/v1/completions", json=seeded, timeout=60).json()["choices"][0]["text"] == first
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "stream": True,
                "logprobs": True, "top_logprobs": 2}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=chat, timeout=60) as resp:
            lines = [line for line in resp.iter_lines() if line.startswith("data: ")]
        assert resp.status_code == 200 and lines[-1] == "data: [DONE]"
        assert engine.stats()["kv_blocks_used"] == 0


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor parallelism over NCCL needs two GPUs")
def test_tensor_parallel_over_nccl_matches_one_gpu(tmp_path):
    from agents.runtime.server.launcher import free_port

    model_dir = cached_model("llama")
    alone = LLMEngine(model_dir, device="cuda", num_blocks=64).generate(["The quick brown fox"], GREEDY)[0]
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "day0cli", "serve", str(model_dir), "--tp", "2", "--device", "cuda",
             "--port", str(port), "--num-blocks", "64"],
            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1"}, cwd=REPO)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_ready(url, proc, log, timeout=180)
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "The quick brown fox", "max_tokens": 8,
                                                      "temperature": 0, "ignore_eos": True}, timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == alone.text
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "The quick brown fox", "max_tokens": 8}, timeout=60)
        assert r.status_code == 200, r.text
    finally:
        proc.terminate()
        proc.wait(timeout=60)
