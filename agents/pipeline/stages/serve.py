"""The ``serve`` stage: start ``day0 serve`` on the model as a subprocess on a free port, wait for ``/ready``,
exercise the text path through ``/v1/completions`` (plain and streamed) and, whenever the model has a chat
template (``tokenizer_config.json``'s ``chat_template``, or ``chat_template.jinja`` as transformers 5 saves it),
``/v1/chat/completions`` — checking that the server rendered the conversation into as many prompt tokens as
``transformers``' own ``apply_chat_template`` gives (the response's usage says how many the model was sent). The server stays up in ``ctx.shared["server"]`` for the
bench stage; ``stop(ctx)`` (also run at exit) ends it."""

from __future__ import annotations

import atexit
import base64
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from agents.pipeline.support import compiled
from agents.pipeline.support.context import StageContext, StageFailed
from agents.pipeline.support.nodes import stage_node
from agents.pipeline.support.sharded_load import effective_layout, effective_tp
from agents.runtime.commands.serve import serve_command
from agents.runtime.engine.multimodal import config_takes_images


class ServerProcess:
    """A ``day0 serve`` child process; a context manager that stops it."""

    def __init__(
        self,
        model_dir: Path,
        *,
        dtype: str,
        device: str,
        tp: int | None,
        log_path: Path,
        extra_args: list[str] | None = None,
        layout_args: tuple[str, ...] = (),
    ) -> None:
        from agents.runtime.server.launcher import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.tp = tp or 1
        cmd = serve_command(model_dir, dtype=dtype, device=device, port=self.port,
                            args=[*(["--tp", str(tp)] if tp else []), *(extra_args or []), *layout_args])
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        env.pop("DAY0_API_KEY", None)  # the stage's own server on 127.0.0.1: its clients send no API key
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            cmd, stdout=self._log, stderr=subprocess.STDOUT, env=env, cwd=Path(__file__).resolve().parents[3]
        )
        atexit.register(self.stop)

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def wait_ready(self, timeout: float, ctx: StageContext | None = None) -> float:
        """Seconds until ``/ready`` answered 200; StageFailed with the log tail if it died or timed out."""
        deadline = self.started + timeout
        while time.monotonic() < deadline:
            if ctx is not None:
                ctx.check_cancelled()
            if self.proc.poll() is not None:
                raise StageFailed(f"server exited with code {self.proc.returncode} before ready:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/ready", timeout=2).status_code == 200:
                    return time.monotonic() - self.started
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise StageFailed(f"server not ready after {timeout:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if not self._log.closed:
            self._log.close()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_server(ctx: StageContext) -> ServerProcess:
    if ctx.model_dir is None:
        raise StageFailed("serve needs the model's weights, but this job has no model directory")
    extra = [str(a) for a in ctx.bench.get("serve_args", [])] + compiled.serve_args(ctx)  # bench.compile
    tp, _ = effective_tp(ctx)
    _, ep, pp = effective_layout(ctx)
    layout = tuple(a for name, v in (("--ep", ep), ("--pp", pp)) if v > 1 for a in (name, str(v)))
    node = stage_node(ctx, "serve")  # ranks across hosts: this node's share, node 0 serving HTTP
    layout += tuple(node.as_args()) if node is not None else ()
    server = ServerProcess(
        Path(ctx.model_dir),
        dtype=ctx.dtype,
        device=ctx.device,
        tp=tp if tp > 1 else None,
        log_path=Path(ctx.workdir) / "serve.log",
        extra_args=extra,
        layout_args=layout,
    )
    ctx.shared["server"] = server
    ctx.shared["server_url"] = server.url
    return server


def stop(ctx: StageContext) -> None:
    """Stop the server this pipeline started (safe to call twice)."""
    server = ctx.shared.pop("server", None)
    ctx.shared.pop("server_url", None)
    if server is not None:
        server.stop()


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


def expected_chat_ids(ctx: StageContext) -> list[int] | None:
    """The prompt tokens ``transformers`` renders for ``CHAT_MESSAGES`` (what the server must send the model)."""
    from agents.pipeline.support.models import tokenizer

    tok = tokenizer(ctx)
    if tok is None or not getattr(tok, "chat_template", None):
        return None
    rendered = tok.apply_chat_template(CHAT_MESSAGES, add_generation_prompt=True, tokenize=False)
    return list(tok(rendered, add_special_tokens=False)["input_ids"])


def text_path_checks(url: str, has_chat_template: bool,
                     expected_chat: list[int] | None = None) -> list[dict[str, Any]]:
    """The completions (plain, streamed) and, with a template, chat checks: ``{name, ok, detail}`` each."""
    client = httpx.Client(base_url=url, timeout=120)
    req = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}

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
        r = client.post("/v1/chat/completions", json={"messages": CHAT_MESSAGES, "max_tokens": 8, "temperature": 0})
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
    client = httpx.Client(base_url=url, timeout=120)
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


def run(ctx: StageContext) -> dict[str, Any]:
    """The serve section: ready_seconds, endpoint, tp (ranks serving: the job's override, else the plan's
    degree clipped to this host), text_path_ok, chat_path_ok (None when the model has no chat template),
    image_path_ok (None when the model takes no images), chat_template (where it was found), checks."""
    stop(ctx)  # a server left by an earlier run of this stage
    server = start_server(ctx)
    timeout = float(ctx.bench.get("ready_timeout", 900))
    try:
        ready_seconds = server.wait_ready(timeout, ctx)
    except BaseException:
        stop(ctx)
        raise
    template = chat_template_source(Path(ctx.model_dir))
    try:
        expected = expected_chat_ids(ctx) if template else None
    except Exception as exc:  # noqa: BLE001 — the chat check then runs without the renderer comparison
        expected, template_note = None, f"transformers could not render the chat template: {exc}"
    else:
        template_note = None
    checks = text_path_checks(server.url, template is not None, expected)
    takes_images = config_takes_images(ctx.config)
    if takes_images:
        checks += image_path_checks(server.url, Path(ctx.model_dir))
    by_name = {c["name"]: c["ok"] for c in checks}
    text_ok = by_name["completions"] and by_name["completions_stream"]
    chat_ok = by_name.get("chat_completions") if template else None
    image_ok = (by_name["image_chat"] and by_name["image_chat_stream"]) if takes_images else None
    ok = text_ok and chat_ok is not False and image_ok is not False
    notes = [] if template else ["no chat template: /v1/chat/completions not exercised"]
    notes += [template_note] if template_note else []
    tp_note = effective_tp(ctx)[1]
    notes += [tp_note] if tp_note else []
    compile_block = None
    if compiled.requested(ctx):  # the compiled path's evidence: compile seconds, graphs, cache hits and misses
        try:
            compile_block = compiled.serve_evidence(ctx, server.url, ready_seconds)
        except StageFailed:
            stop(ctx)
            raise
    if not ok:
        notes.append(f"server log tail:\n{server.log_tail()}")
        stop(ctx)
    return {
        **({"compile": compile_block} if compile_block is not None else {}),
        "ready_seconds": round(ready_seconds, 3),
        "endpoint": server.url,
        "tp": server.tp,
        "text_path_ok": text_ok,
        "chat_path_ok": chat_ok,
        "image_path_ok": image_ok,
        "chat_template": template,
        "has_chat_template": template is not None,
        "checks": checks,
        "notes": notes,
    }
