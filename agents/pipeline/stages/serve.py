"""The ``serve`` stage: start ``day0 serve`` on the model as a subprocess on a free port, wait for ``/ready``,
exercise the text path through ``/v1/completions`` (plain and streamed) and, whenever the model has a chat
template (``tokenizer_config.json``'s ``chat_template``, or ``chat_template.jinja`` as transformers 5 saves it),
``/v1/chat/completions`` — checking that the server rendered the conversation into as many prompt tokens as
``transformers``' own ``apply_chat_template`` gives (the response's usage says how many the model was sent).
The server stays up in ``ctx.state.server`` for the bench stage; ``support.server.stop_server`` (also run at
exit) ends it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from agents.pipeline.support.compiled import requested, skipped
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.endpoints import (
    chat_template_source,
    chat_template_text,
    expected_chat_ids,
    image_path_checks,
    text_path_checks,
)
from agents.pipeline.support.engine_process import EngineProcess
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.layout import effective_tp
from agents.pipeline.support.server import start_server, stop_server
from agents.runtime.engine.multimodal import config_takes_images
from contract.conformance import declares_tools


def compile_evidence(ctx: StageContext, url: str, ready_seconds: float) -> dict[str, Any]:
    """The serve section's ``compile`` block: the server's ``/stats/compile`` after its warm-up."""
    not_run = skipped(ctx)
    if not_run is not None:
        return not_run
    try:
        r = httpx.get(f"{url}/stats/compile", timeout=30)
        body = r.json()
    except (httpx.HTTPError, ValueError) as exc:
        raise StageFailed(f"the compiled server did not answer /stats/compile: {exc}") from exc
    if r.status_code != 200 or body.get("enabled") is not True:
        raise StageFailed(f"the server was started with --compile but /stats/compile says {body!r:.300}")
    ctx.state.compiled_server = url  # the bench compares this server with an eager one
    return {"requested": True, **body, "ready_seconds": round(ready_seconds, 3)}


def run(ctx: StageContext) -> dict[str, Any]:
    """The serve section: ready_seconds, endpoint, tp (ranks serving: the job's override, else the plan's
    degree clipped to this host), text_path_ok, chat_path_ok (None when the model has no chat template),
    image_path_ok (None when the model takes no images), chat_template (where it was found), checks."""
    kept = ctx.state.server
    if isinstance(kept, EngineProcess) and kept.ready_seconds is not None and kept.proc.poll() is None:
        server, ready_seconds = kept, kept.ready_seconds  # the engine endpoint align started: one start per job
    else:
        stop_server(ctx)  # a server left by an earlier run of this stage
        server = start_server(ctx)
        timeout = float(ctx.bench.get("ready_timeout", 900))
        try:
            ready_seconds = server.wait_ready(timeout, ctx)
        except BaseException:
            stop_server(ctx)
            raise
    template = chat_template_source(Path(ctx.model_dir))
    try:
        expected = expected_chat_ids(ctx) if template else None
    except Exception as exc:  # noqa: BLE001 — the chat check then runs without the renderer comparison
        expected, template_note = None, f"transformers could not render the chat template: {exc}"
    else:
        template_note = None
    model = server.served_model() if isinstance(server, EngineProcess) else None  # the id its requests name
    checks = text_path_checks(server.url, template is not None, expected, model)
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
    if requested(ctx) and not isinstance(server, EngineProcess):  # the compiled path's evidence: compile seconds, graphs, cache hits and misses
        try:
            compile_block = compile_evidence(ctx, server.url, ready_seconds)
        except StageFailed:
            stop_server(ctx)
            raise
    if not ok:
        notes.append(f"server log tail:\n{server.log_tail()}")
        stop_server(ctx)
    return {
        **({"engine": server.evidence()} if isinstance(server, EngineProcess) else {}),  # what ran, exactly
        **({"compile": compile_block} if compile_block is not None else {}),
        "ready_seconds": round(ready_seconds, 3),
        "endpoint": server.url,
        "tp": server.tp,
        "text_path_ok": text_ok,
        "chat_path_ok": chat_ok,
        "image_path_ok": image_ok,
        "chat_template": template,
        "has_chat_template": template is not None,
        # the template reads ``tools``: tier 3 then needs a passing conformance section (contract.tiers)
        "template_declares_tools": declares_tools(chat_template_text(Path(ctx.model_dir))) if template else False,
        "checks": checks,
        "notes": notes,
    }
