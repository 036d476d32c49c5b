"""The ``inventory`` stage: the operator checklist of a model on a target.

Every aten operator of one prefill and one decode step of the runtime's own model is captured
(``model`` builds or reuses the model and runs the steps, ``support.op_capture`` records them), then
classified against the target's operator library by the dispatch key that serves it (``classify``):
native, decomposed, fallback or missing, with ``served_by`` naming the registration.

A runtime model that cannot be traced fails the stage with that error; only a model on the fallback path (the
architecture's own ``transformers`` code) may be traced through ``transformers`` directly when its runtime
wrapper cannot, and the section says so (``model_source``)."""

from __future__ import annotations

from typing import Any

import torch

from agents.pipeline.stages.inventory.classify import STATUSES, Classifier, classify_ops
from agents.pipeline.stages.inventory.model import (
    PREFILL_TOKENS,
    device_usable,
    runtime_model,
    runtime_steps,
    transformers_model,
    transformers_steps,
)
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.environment import dispatch_key_for
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.op_capture import OperatorRecorder, OpRecord

__all__ = ["STATUSES", "Classifier", "OpRecord", "OperatorRecorder", "capture", "classify_ops", "run"]


def capture(config: dict[str, Any], *, dtype: str, device: str, model: Any = None) -> tuple[OperatorRecorder, dict]:
    """Trace one prefill and one decode step of the runtime model (``model`` when given, e.g. the one the load
    stage loaded, else built from ``config``); returns the recorder and how the trace was made."""
    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise StageFailed(f"unknown dtype {dtype!r}")
    vocab = int(config.get("vocab_size") or (config.get("text_config") or {}).get("vocab_size") or 0)
    if vocab <= 0:
        raise StageFailed("config.json has no positive 'vocab_size'")
    if model is not None:
        trace_device = str(next(iter(model.parameters())).device) if hasattr(model, "parameters") else device
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        source = "loaded"
    else:
        model, trace_device, weight_bytes = runtime_model(config, torch_dtype, device)
        source = "random weights"
    path = getattr(model, "path", "native")
    info: dict[str, Any] = {"trace_device": trace_device, "weight_bytes": weight_bytes, "path": path,
                            "prefill_tokens": PREFILL_TOKENS, "decode_tokens": 1,
                            "model_source": f"runtime-{path}", "weights": source}
    torch.manual_seed(0)
    recorder = OperatorRecorder()
    try:
        runtime_steps(model, trace_device, vocab, recorder)
    except Exception as exc:  # noqa: BLE001 — named in the stage's error, or (fallback path only) noted
        error = f"{type(exc).__name__}: {exc}"
        if path != "fallback":
            raise StageFailed(f"the runtime's {path} model cannot be traced: {error}") from exc
        info.update(runtime_trace_error=error, model_source="transformers")
        recorder = OperatorRecorder()
        hf_device = trace_device if trace_device == "meta" else device
        transformers_steps(transformers_model(config, torch_dtype, hf_device), hf_device, vocab, recorder)
    return recorder, info


def run(ctx: StageContext) -> dict[str, Any]:
    """The ``inventory`` stage."""
    device = ctx.device
    try:
        key = dispatch_key_for(device)
    except ValueError as exc:
        raise StageFailed(str(exc)) from exc
    ctx.emit("log", f"tracing a prefill of {PREFILL_TOKENS} tokens and one decode step")
    model = ctx.state.model
    if model is not None and (ctx.results.get("load") or {}).get("tp", 1) != 1:
        model = None  # a sharded load leaves no whole model here
    try:
        recorder, info = capture(ctx.config, dtype=ctx.dtype, device=device, model=model)
    except StageFailed:
        raise
    except Exception as exc:  # noqa: BLE001 — any failure of the trace is the stage's evidence
        raise StageFailed(f"operator trace failed: {type(exc).__name__}: {exc}") from exc
    ctx.check_cancelled()
    total = len(recorder.ops)
    ctx.progress(0, total, "operators checked")

    def progress(done: int, n: int) -> None:
        if done == n or done % 8 == 0:
            ctx.progress(done, n, "operators checked")
            ctx.check_cancelled()

    run_device = device if device_usable(device) else None
    section = classify_ops(recorder, key, ctx.hardware.get("operator_manifest"), progress, run_device,
                           model_path=info["path"] if info["model_source"] != "transformers" else "fallback")
    section.update(info, dispatch_key=key, device=device, kernels_run_on=run_device or "meta")
    s = section["summary"]
    ctx.emit("log", f"{total} operators: {s['native']} native, {s['decomposed']} decomposed, "
                    f"{s['fallback']} fallback, {s['missing']} missing")
    return section
