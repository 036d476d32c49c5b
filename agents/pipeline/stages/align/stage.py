"""The ``align`` stage: the target (our runtime model on the job's device and dtype) against the reference
(``transformers`` fp32 on CPU, same weights) — per operator (``ops``), per layer, end to end, and the KV-cache
consistency check (``kv``); for a vision-language model its image path (``vision``), for a job on the compiled
path compiled against eager tokens (``compiled``). Thresholds: the defaults of ``contract.thresholds``, overridable per job."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from agents.pipeline.stages.align import compiled as compiled_part
from agents.pipeline.stages.align import kv, ops, vision
from agents.pipeline.stages.align import original as original_part
from agents.pipeline.stages.align.e2e import PROMPTS, challenge_raw, run_e2e
from agents.pipeline.stages.align.layers import run_layers
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import JobCancelled
from agents.pipeline.support.models import align_thresholds, encode, reference_model, target_model
from agents.runtime.engine.multimodal import config_takes_images

# the checks that run as parts of the section, each in its own module: section key -> the part's run(ctx)
PARTS: dict[str, Callable[[StageContext], Any]] = {"ops": ops.run, "kv_cache": kv.run, "vision": vision.run,
                                                   "compile": compiled_part.run}


def _run_part(ctx: StageContext, section: dict[str, Any], notes: list[str], key: str) -> None:
    """Merge a part into ``section``. A part that is not registered, or that crashes, leaves the section
    *incomplete* (``missing`` names it, ``passed`` is false) but keeps the other parts' evidence."""
    part_run = PARTS.get(key)
    if part_run is None:
        section.setdefault("missing", []).append(key)
        section.setdefault("part_errors", {})[key] = f"no {key} check is registered"
        notes.append(f"{key} not checked: no {key} check is registered (the section is incomplete)")
        return
    try:
        ctx.emit("log", f"align: {key} check started")
        part = part_run(ctx)
    except (JobCancelled, KeyboardInterrupt):
        raise
    except Exception as exc:  # the other checks' evidence is still worth keeping
        section.setdefault("part_errors", {})[key] = f"{type(exc).__name__}: {exc}"
        notes.append(f"{key} check failed to run: {type(exc).__name__}: {exc}")
        return
    if key == "ops":
        section["ops"] = part if isinstance(part, list) else part.get("ops", [])
        section["ops_unchecked"] = [row["op"] for row in section["ops"] if row.get("status") == "unchecked"]
        if isinstance(part, dict) and "inventory_coverage" in part:
            section["inventory_coverage"] = part["inventory_coverage"]
    else:
        section[key] = part


SELF_REFERENCE = ("the target runs the reference implementation (transformers fallback): operator/layer alignment "
                  "compares it with itself")


def fallback_reference_note(target: Any) -> str | None:
    """What the comparison means when the target is the transformers fallback in fp32 on the CPU, the
    reference's own code on the reference's device and dtype (None otherwise)."""
    if getattr(target, "path", None) != "fallback" or getattr(target, "dtype", None) != torch.float32:
        return None
    if torch.device(getattr(target, "device", "cpu")).type != "cpu":
        return None
    if getattr(target, "decode_path", None) == "paged":  # its cached decode runs the runtime's attention
        return (f"{SELF_REFERENCE}; the end-to-end and KV-cache checks compare the runtime's paged attention, which "
                "it decodes with, against transformers")
    return SELF_REFERENCE


def run(ctx: StageContext) -> dict[str, Any]:
    """The align section: passed, thresholds, ops, layers, e2e, kv_cache (docs/stage-report.md)."""
    thresholds = align_thresholds(ctx)
    target = target_model(ctx)
    ctx.emit("log", "align: loading the transformers fp32 CPU reference")
    ref = reference_model(ctx)
    notes: list[str] = []
    section: dict[str, Any] = {"passed": False, "thresholds": thresholds,
                               "reference": "transformers fp32 cpu", "target": {"device": ctx.device,
                                                                                  "dtype": ctx.dtype}}
    steps = 4
    ctx.progress(0, steps, "alignment checks")
    _run_part(ctx, section, notes, "ops")
    ctx.check_cancelled()
    ctx.progress(1, steps, "alignment checks")

    seqs, enc_notes = encode(ctx, list(PROMPTS))
    notes += enc_notes
    section["layers"], layer_notes = run_layers(ctx, target, ref, seqs, thresholds)
    notes += layer_notes
    ctx.check_cancelled()
    ctx.progress(2, steps, "alignment checks")

    section["e2e"], e2e_notes = run_e2e(ctx, target, ref, thresholds)
    notes += e2e_notes
    raw, raw_notes = challenge_raw(ctx, target)  # a certify job's drawn e2e items, for the portal to score
    if raw is not None:
        section["e2e"]["raw"] = raw
    notes += raw_notes
    cost, cost_notes = original_part.run(ctx, target)  # a quantised release against its original: informational
    if cost is not None:
        section["e2e_original"] = cost
    notes += cost_notes
    ctx.check_cancelled()
    ctx.progress(3, steps, "alignment checks")

    _run_part(ctx, section, notes, "kv_cache")
    takes_images = config_takes_images(ctx.config)
    if takes_images:  # the vision encoder and projector against transformers, and image + text greedy e2e
        _run_part(ctx, section, notes, "vision")
    compiled = ctx.bench.get("compile") is True  # the compiled path's greedy tokens against eager ones
    if compiled:
        _run_part(ctx, section, notes, "compile")
    ctx.progress(4, steps, "alignment checks")

    # unchecked operators are listed, never counted as passing; the runtime's own checked ones must all pass
    checked = [row for row in section.get("ops") or [] if row.get("status") != "unchecked"]
    fallback = getattr(target, "path", None) == "fallback"
    ops_ok = "ops" in section and (bool(checked) or fallback) and all(row.get("passed") for row in checked)
    layers_ok = bool(section["layers"]) and all(row["passed"] for row in section["layers"])
    kv_ok = "kv_cache" in section and bool(section["kv_cache"].get("passed"))
    parts_ok = not section.get("part_errors")
    vision_ok = bool((section.get("vision") or {}).get("passed")) if takes_images else True
    compile_ok = bool((section.get("compile") or {}).get("passed")) if compiled else True
    missing = [key for key in ("ops", "layers", "e2e", "kv_cache", *(("vision",) if takes_images else ()))
               if not section.get(key)]
    if missing:
        section["missing"] = sorted(set(section.get("missing", [])) | set(missing))
    section["complete"] = not missing
    section["passed"] = (ops_ok and layers_ok and section["e2e"]["passed"] and kv_ok and parts_ok and vision_ok
                         and compile_ok and not missing)
    section["checks"] = {"ops": ops_ok if "ops" in section else None, "layers": layers_ok,
                         "e2e": section["e2e"]["passed"], "kv_cache": kv_ok if "kv_cache" in section else None,
                         "vision": vision_ok if takes_images else None, "compile": compile_ok if compiled else None}
    self_reference = fallback_reference_note(target)
    if self_reference is not None:  # passing here says nothing about the device: the cell shows this instead
        section["fallback_reference_identical"] = True
        notes.insert(0, self_reference)
    section["notes"] = notes
    return section
