"""The checks of a served model's HTTP paths: completions (plain and streamed), chat (the server's rendering of
the chat template against ``transformers``' own ``apply_chat_template``) and, for a model that takes images, image
chat (the prompt as long as the model's processor makes it). Each check is ``{name, ok, detail}``."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import httpx

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.models import tokenizer
from contract.conformance import template_text
from telemetry import tracing


def _check(name: str, fn: Any) -> dict[str, Any]:
    try:
        detail = fn()
        return {"name": name, "ok": True, "detail": detail}
    except (AssertionError, httpx.HTTPError, KeyError, ValueError, IndexError) as exc:
        return {"name": name, "ok": False, "detail": f"{type(exc).__name__}: {exc}"}


CHAT_MESSAGES = [{"role": "user", "content": "Say hello."}]


def chat_template_source(model_dir: Path) -> str | None:
    """Where the model's chat template lives ("tokenizer_config.json" or "chat_template.jinja"), or None."""
    tok_cfg = model_dir / "tokenizer_config.json"
    if tok_cfg.exists():
        try:
            template = json.loads(tok_cfg.read_text()).get("chat_template")
        except (OSError, ValueError, AttributeError):
            template = None
        if template:
            return "tokenizer_config.json"
    jinja = model_dir / "chat_template.jinja"
    if jinja.is_file() and jinja.read_text(errors="replace").strip():
        return "chat_template.jinja"
    return None


def chat_template_text(model_dir: Path) -> str | None:
    """The chat template's text as the checkpoint ships it (``tokenizer_config.json``'s, a list of named
    templates read together, else ``chat_template.jinja``), or None."""
    tok_cfg = model_dir / "tokenizer_config.json"
    try:
        text = template_text(json.loads(tok_cfg.read_text()).get("chat_template")) if tok_cfg.is_file() else None
    except (OSError, ValueError, AttributeError):
        text = None
    jinja = model_dir / "chat_template.jinja"
    if text is None and jinja.is_file():
        text = jinja.read_text(errors="replace") or None
    return text


def expected_chat_ids(ctx: StageContext) -> list[int] | None:
    """The prompt tokens ``transformers`` renders for ``CHAT_MESSAGES`` (what the server must send the model)."""
    tok = tokenizer(ctx)
    if tok is None or not getattr(tok, "chat_template", None):
        return None
    rendered = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=False)
    return list(tok(rendered, add_special_tokens=False)["input_ids"])


def text_path_checks(url: str, has_chat_template: bool,
                     expected_chat: list[int] | None = None, model: str | None = None) -> list[dict[str, Any]]:
    """The completions (plain, streamed) and, with a template, chat checks: ``{name, ok, detail}`` each. ``model``:
    the served model id the requests name (an external engine's)."""
    client = httpx.Client(base_url=url, timeout=120, headers=tracing.inject())  # the job's trace goes on
    named = {"model": model} if model else {}
    req = {**named, "prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}

    def completion() -> str:
        r = client.post("/v1/completions", json=req)
        assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:200]}"
        body = r.json()
        assert body["usage"]["completion_tokens"] >= 1, "no token generated"
        return body["choices"][0]["text"]

    def streamed() -> str:
        chunks, done = [], False
        with client.stream(
            "POST", "/v1/completions", json={**req, "stream": True, "stream_options": {"include_usage": True}}
        ) as r:
            assert r.status_code == 200, f"HTTP {r.status_code}"
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunks.append(json.loads(line[6:]))
        assert done and chunks and chunks[-1]["usage"]["completion_tokens"] >= 1, "stream did not end with usage"
        return f"{len(chunks)} chunks"

    def chat() -> str:
        r = client.post("/v1/chat/completions", json={**named, "messages": CHAT_MESSAGES, "max_tokens": 8,
                                                       "temperature": 0})
        assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:200]}"
        body = r.json()
        assert body["usage"]["completion_tokens"] >= 1, "no token generated"
        if expected_chat is not None:  # the server's own renderer against transformers'
            got = body["usage"]["prompt_tokens"]
            assert got == len(expected_chat), (f"the server rendered the chat into {got} prompt tokens, "
                                               f"transformers' template into {len(expected_chat)}")
        return body["choices"][0]["message"]["content"]

    checks = [_check("completions", completion), _check("completions_stream", streamed)]
    if has_chat_template:
        checks.append(_check("chat_completions", chat))
    client.close()
    return checks


IMAGE_QUESTION = "What is in this image?"


def probe_image_png(side: int = 64) -> bytes:
    """A deterministic test picture (colour gradients with a square), PNG-encoded."""
    import io

    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:side, 0:side]
    pixels = np.stack([x * 255 // side, y * 255 // side, (x + y) * 127 // side], axis=-1).astype(np.uint8)
    pixels[side // 4: side // 2, side // 4: side // 2] = (250, 250, 20)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


def image_messages(png: bytes) -> list[dict[str, Any]]:
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                          {"type": "text", "text": IMAGE_QUESTION}]}]


def expected_image_prompt_tokens(model_dir: Path, png: bytes) -> int:
    """The prompt length the model's own processor gives the image chat (placeholders expanded)."""
    import io

    from PIL import Image

    from agents.runtime.server.images import load_processor

    processor = load_processor(model_dir)  # transformers' AutoProcessor, or the runtime's Qwen-VL composition
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": IMAGE_QUESTION}]}]
    text = processor.apply_chat_template(messages, add_generation_prompt=True)
    out = processor(text=[text], images=[Image.open(io.BytesIO(png)).convert("RGB")], add_special_tokens=False)
    return len(out["input_ids"][0])


def image_path_checks(url: str, model_dir: Path) -> list[dict[str, Any]]:
    """A chat request with an image (data: URL), streamed and not: answered, and its prompt as long as the
    model's processor makes it (each image placeholder expanded to the image's tokens)."""
    client = httpx.Client(base_url=url, timeout=120, headers=tracing.inject())  # the job's trace goes on
    png = probe_image_png()
    request = {"messages": image_messages(png), "max_tokens": 8, "temperature": 0}

    def image_chat() -> str:
        r = client.post("/v1/chat/completions", json=request)
        assert r.status_code == 200, f"HTTP {r.status_code}: {r.text[:200]}"
        body = r.json()
        assert body["usage"]["completion_tokens"] >= 1, "no token generated"
        want = expected_image_prompt_tokens(model_dir, png)
        got = body["usage"]["prompt_tokens"]
        assert got == want, f"the server's image prompt is {got} tokens, the model's processor makes {want}"
        return f"{got} prompt tokens; {body['choices'][0]['message']['content']!r}"

    def image_stream() -> str:
        text, done = [], False
        with client.stream("POST", "/v1/chat/completions", json={**request, "stream": True}) as r:
            assert r.status_code == 200, f"HTTP {r.status_code}"
            for line in r.iter_lines():
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    text += [c["delta"].get("content") or "" for c in chunk.get("choices", [])]
        assert done and "".join(text), "the image stream ended without text"
        return f"{len(text)} deltas"

    checks = [_check("image_chat", image_chat), _check("image_chat_stream", image_stream)]
    client.close()
    return checks
