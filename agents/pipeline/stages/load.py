"""The ``load`` stage: strict streaming load of the checkpoint with the bundled runtime's loader.

At TP=1 the model loads in this process and goes to ``ctx.state.model`` so later stages (inventory, align,
eval) run on it. At TP>1 (``support.layout.effective_tp``: the job's override, else the plan clipped to this
host's devices) ``tp`` ranks each load their slice and the section merges them; inventory, align and eval then
load a TP=1 copy in this process when they need one (the align stage checks that its reference fits). A
portal job's weight challenge (``support.weight_probe``) is answered from the loaded shards at the end."""

from __future__ import annotations

import time
from typing import Any

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.layout import effective_layout, effective_tp
from agents.pipeline.support.sharded_load import load_sharded, quant_args
from agents.pipeline.support.weight_probe import ChallengeError, answer_challenge
from contract.planner.formats import native_type

PROGRESS_INTERVAL_S = 0.5


def run(ctx: StageContext) -> dict[str, Any]:
    """Load the weights on ``ctx.device`` in ``ctx.dtype``; the section is the loader's report."""
    if ctx.model_dir is None:
        raise StageFailed("load needs the model's weights, but this job has no model directory (config only)")
    if not ctx.model_dir.is_dir():
        raise StageFailed(f"model directory {ctx.model_dir} does not exist")
    tp, tp_note = effective_tp(ctx)
    _, ep, pp = effective_layout(ctx)
    if pp * max(tp, ep) > 1:
        section = load_sharded(ctx, tp)
        copy, gib = section["tp1_copy"], 1 << 30
        size = f"{copy['bytes'] / gib:.2f} GiB of {copy['available_bytes'] / gib:.2f} GiB free on {ctx.device}"
        section["notes"] = [f"loaded sharded over tp={tp} ranks; inventory, align and eval load a tp=1 copy "
                            f"in this process when they run ({size})" if copy["fits"] else
                            f"loaded sharded over tp={tp} ranks; a tp=1 copy for inventory, align and eval does "
                            f"not fit ({size}): run those stages where it does"]
        _answer_challenge(ctx, section)
        return section
    from agents.runtime.loader import LoadError, load_model

    last = {"time": 0.0, "done": -1}

    def progress(done: int, total: int) -> None:
        now = time.monotonic()
        if done != last["done"] and (done == total or now - last["time"] >= PROGRESS_INTERVAL_S):
            last.update(time=now, done=done)
            ctx.progress(done, total, "tensors loaded")
        ctx.check_cancelled()

    try:
        result = load_model(
            ctx.model_dir,
            dtype=ctx.dtype,
            device=ctx.device,
            manifest=ctx.manifest,
            fail_on_nonfinite=bool(ctx.thresholds.get("fail_on_nonfinite", 0)),
            progress=progress,
            quant_mode=ctx.quant_mode,
            hardware_declares=quant_args(ctx)[1],
        )
    except LoadError as exc:
        raise StageFailed(str(exc)) from exc
    ctx.state.model = result.model
    section = dict(result.report)
    section.setdefault("path", getattr(result.model, "path", None))
    section.setdefault("tp", 1)  # loaded in this process
    _hardware_declares(ctx, section)
    if tp_note:
        section["notes"] = [tp_note]
    _answer_challenge(ctx, section)
    return section


def _hardware_declares(ctx: StageContext, section: dict[str, Any]) -> None:
    """A quantised release: whether the hardware declares the format's element type (``contract`` hardware data,
    as the plan's ``quant.mode`` reads it); the runtime's own ``mode`` stays what it did (docs/quantized.md)."""
    quant, dtypes = section.get("quant"), (ctx.hardware or {}).get("dtypes")
    if isinstance(quant, dict) and isinstance(quant.get("format"), str) and dtypes:
        declared = {str(d).removesuffix("uz") for d in dtypes}  # AMD's fnuz FP8 runs the fn format
        section["quant"] = {**quant, "hardware_declares": native_type(quant["format"]) in declared}


def _answer_challenge(ctx: StageContext, section: dict[str, Any]) -> None:
    """The portal's weight challenge answered from the shards just loaded (a few small reads)."""
    if ctx.weight_samples is None and ctx.weight_probe is None:
        return
    try:
        answer_challenge(ctx.model_dir, section, ctx.weight_samples, ctx.weight_probe)
    except (ChallengeError, OSError) as exc:
        raise StageFailed(f"weight challenge: {exc}") from exc
