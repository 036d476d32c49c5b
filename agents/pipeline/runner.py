"""Run the requested stages of the pipeline in ``tiers.STAGE_ORDER`` and assemble the stage report (docs/stage-report.md).

The runner stops at the first stage that raises (``StageFailed`` or any other exception) or whose section is
not passing evidence; the report then names that stage and why. Whether a section passes is the verdict of
``contract.verdicts`` (the same rules the portal judges with, on the job's thresholds and the facts the
pipeline knows: config, manifest, chat template, hardware), so the tier a report claims is the tier the portal
computes from the same numbers; each stage's verdict is kept in ``report["verdicts"]``. A section whose own flags
say it failed stops the run too. A section of raw outputs answering the portal's challenge (``scored_by``
"portal", docs/references.md) is judged by the portal alone: its local verdict is kept and stops nothing.
``JobCancelled`` ends the run with the stage it interrupted and the error "cancelled"."""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from agents.pipeline.registry import STAGES, Stage
from agents.pipeline.support import report as report_mod
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.endpoints import chat_template_source, chat_template_text
from agents.pipeline.support.errors import JobCancelled, StageFailed
from agents.pipeline.support.server import stop_engine
from agents.runtime.engine.multimodal import config_takes_images
from contract import sections, thresholds, tiers, verdicts
from contract.conformance import declares_tools
from contract.engines import INTERNAL_STAGES, is_external
from telemetry import tracing


def known_threshold_keys() -> set[str]:
    """Every threshold key some stage reads (``thresholds.known_keys``)."""
    return thresholds.known_keys()


check_thresholds = thresholds.check_thresholds


def parse_stages(stages: Iterable[str] | str) -> list[str]:
    """The requested stages in ``tiers.STAGE_ORDER``; an unknown name is a ValueError naming it."""
    names = [s.strip() for s in (stages.split(",") if isinstance(stages, str) else stages) if s.strip()]
    unknown = [s for s in names if s not in tiers.STAGE_ORDER]
    if unknown:
        raise ValueError(f"unknown stage(s) {', '.join(map(repr, unknown))}; stages are {', '.join(tiers.STAGE_ORDER)}")
    if not names:
        raise ValueError("no stages requested")
    return [s for s in tiers.STAGE_ORDER if s in names]


def stage_of(stage: str) -> Stage:
    """The registered ``run(ctx)`` of ``stage``; a name without one is a StageFailed naming it."""
    run = STAGES.get(stage)
    if run is None:
        raise StageFailed(f"stage {stage!r} is not available: no stage is registered under that name")
    return run


def model_info(ctx: StageContext) -> dict[str, Any]:
    """The report's ``model`` block: name (``ctx.state.model_name`` when the caller knows it, else the
    directory's name), architecture, and which runtime path runs it."""
    archs = ctx.config.get("architectures") or []
    architecture = archs[0] if archs else None
    name = ctx.state.model_name or (ctx.model_dir.name if ctx.model_dir is not None else None)
    name = name or ctx.config.get("_name_or_path") or architecture
    model = ctx.state.model
    path, reason = getattr(model, "path", None), getattr(model, "fallback_reason", None)
    if path is None and architecture:
        try:
            from agents.runtime.models.registry import runtime_path
        except ImportError:
            path = None
        else:
            path, reason = runtime_path(ctx.config)
    info = {"name": name, "architecture": architecture, "path": path}
    if path == "fallback":
        info["fallback_reason"] = reason  # why the transformers code runs it (no native family, or an option)
        if hasattr(model, "decode_path"):  # "paged": the runtime's KV cache and batching; else why not
            info["fallback_decode"] = model.decode_path
            if model.decode_reason:
                info["fallback_decode_reason"] = model.decode_reason
    return info


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _hardware_slug(ctx: StageContext) -> str | None:
    hw = ctx.hardware
    return hw.get("slug") if isinstance(hw, dict) else getattr(hw, "slug", None)


def judging_context(ctx: StageContext, stages: dict[str, Any] | None = None) -> verdicts.Context:
    """The facts the pipeline judges its own sections with (as the portal's ``judging_context`` does with the
    release's): the config, the manifest the job carries, whether the model has a chat template, its context,
    which runtime path loaded it, the hardware's memory and the job's dtype."""
    config = ctx.config or {}
    has_template = None
    if ctx.model_dir is not None:
        has_template = chat_template_source(ctx.model_dir) is not None
    context = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    path = ((stages or {}).get("load") or {}).get("path") or getattr(ctx.state.model, "path", None)
    hw = ctx.hardware if isinstance(ctx.hardware, dict) else {}
    memory = hw.get("memory_bytes") or int(float(hw.get("memory_gb") or 0) * 1e9)
    hardware = verdicts.HardwareFacts(
        memory_bytes=int(memory), devices_per_node=int(hw.get("devices_per_node") or 1),
        shared_memory=bool(hw.get("shared_memory")), dtypes=tuple(hw.get("dtypes") or ()),
        memory_bandwidth_gbps=hw.get("memory_bandwidth_gbps"),
    ) if memory else None
    stages = stages or {}
    plan = (stages.get("plan") or {}).get("plan") or {}
    inventory = (stages.get("inventory") or {}).get("ops")
    return verdicts.Context(
        model=verdicts.ModelFacts(config=config, has_chat_template=has_template, manifest=ctx.manifest or None,
                                  template_declares_tools=template_declares_tools(ctx),
                                  takes_images=config_takes_images(config),
                                  manifest_source="given" if ctx.manifest else "",
                                  context_length=int(context) if context else None, runtime_path=path),
        hardware=hardware, dtype=ctx.dtype,
        layout={k: getattr(ctx, k, None) or plan.get(k) for k in ("tp", "pp", "ep")},
        bench_asked=dict(ctx.bench or {}),
        inventory_ops=[str(r.get("op")) for r in inventory if isinstance(r, dict)] if isinstance(inventory, list)
        else None,
        engine=(ctx.engine or {}).get("name") if isinstance(ctx.engine, dict) else None,
    )


def template_declares_tools(ctx: StageContext) -> bool:
    """Whether the model's chat template reads ``tools`` (the pipeline then runs conformance after serve)."""
    return ctx.model_dir is not None and declares_tools(chat_template_text(ctx.model_dir))


def portal_scored(ctx: StageContext, section: dict[str, Any]) -> bool:
    """A section of raw outputs answering the job's challenge (``scored_by`` "portal"): the portal scores it
    against the reference it holds, so the agent's own verdict of it is kept but stops nothing (its tier claim
    does not count the stage)."""
    return isinstance(ctx.challenge, dict) and section.get("scored_by") == "portal"


def run_pipeline(ctx: StageContext, stages: Iterable[str] | str) -> dict[str, Any]:
    """Run ``stages`` (in ``tiers.STAGE_ORDER``) on ``ctx`` and return the whole stage report."""
    requested = tiers.with_conformance(parse_stages(stages), template_declares_tools(ctx))
    ctx.state.stages_requested = tuple(requested)  # a stage may keep what a later one needs (bench: the server)
    started = time.time()
    report: dict[str, Any] = {
        "model": model_info(ctx),
        "hardware": _hardware_slug(ctx),
        "dtype": ctx.dtype,
        "device": ctx.device,
        "tier": 0,
        "failed_stage": None,
        "error": None,
        "stages_requested": requested,
        "started_at": _now(),
        "finished_at": None,
        "stages": {},
        "verdicts": {},
        "seconds": {},
        "notes": [],
    }
    try:
        for stage in requested:
            error = run_stage(ctx, stage, report)
            if error is not None:
                report["failed_stage"], report["error"] = stage, error
                break
    finally:
        stop_engine(ctx)  # an external engine ends with the job, whatever happened
    ctx.current_stage = ""
    report["model"] = model_info(ctx)  # the load stage knows which path runs it
    report["notes"] += [f"{name}: {note}" for name, sec in report["stages"].items() for note in sec.get("notes", [])]
    # the tier the verdicts reach; the stage the run stopped at never counts, whatever its verdict said
    report["tier"] = tiers.compute_tier({stage: v["status"] == verdicts.PASS and stage != report["failed_stage"]
                                         for stage, v in report["verdicts"].items()},
                                        template_declares_tools=template_declares_tools(ctx))
    report["tier_name"] = tiers.TIER_NAMES[report["tier"]]
    report["seconds"]["total"] = round(time.time() - started, 3)
    report["finished_at"] = _now()
    problems = report_mod.report_problems(report)
    if problems:  # the runner's own contract: a bug here, never a model problem
        raise RuntimeError(f"stage report violates the stage report's keys (docs/stage-report.md): {', '.join(problems)}")
    return report


def not_applicable(ctx: StageContext, stage: str, section: dict[str, Any]) -> bool:
    """Whether ``section`` says its stage reads internals the job's external engine does not expose."""
    return section.get("applicable") is False and is_external(ctx.engine) and stage in INTERNAL_STAGES


def run_stage(ctx: StageContext, stage: str, report: dict[str, Any]) -> str | None:
    """Run one stage and record it in ``report`` (its section, verdict and seconds) and in ``ctx.results``, with
    its started / result / finished events; the error that stops the pipeline, or None when it passed."""
    ctx.current_stage = stage
    t0 = time.perf_counter()
    section: dict[str, Any] | None = None
    error: str | None = None
    try:
        ctx.check_cancelled()
        ctx.emit("stage_started", f"{stage} started", data={"stage": stage})
        with tracing.span(f"stage {stage}", stage=stage):  # under the job's span when an agent runs it
            section = stage_of(stage)(ctx)
        if not isinstance(section, dict):
            raise StageFailed(f"stage {stage!r} returned {type(section).__name__}, not its report section")
        section = report_mod.json_safe(section)
        malformed = sections.type_problems(stage, section)
        if malformed:  # the portal would refuse it with the same sentence: nothing of it is posted
            section = None
            raise StageFailed(f"stage {stage!r} returned a malformed section: "
                              + "; ".join(f"{path}: {message}" for path, message in malformed))
        missing = sections.section_problems(stage, section)
        if missing:
            raise StageFailed(f"stage {stage!r} returned a section without required keys: {', '.join(missing)}")
        verdict = verdicts.judge(stage, section, ctx.thresholds, judging_context(ctx, {**ctx.results, stage: section}))
        report["verdicts"][stage] = verdict.as_dict()
        if portal_scored(ctx, section):  # raw challenge outputs: only the portal holds their reference
            report["verdicts"][stage]["scored_by"] = "portal"
        elif not_applicable(ctx, stage, section):  # an external engine's internals: said, never a failure
            report["verdicts"][stage]["not_applicable"] = True
        elif not verdict.passed:
            error = "; ".join(verdict.reasons) or report_mod.failure_reason(stage, section)
        elif verdicts.claimed(stage, section) is False:  # the stage itself says it did not pass
            error = report_mod.failure_reason(stage, section)
    except JobCancelled:
        error = "cancelled"
    except StageFailed as exc:
        error = str(exc) or f"{stage} failed"
    except Exception as exc:  # a bug or an environment problem: the report says what, the log says where
        error = f"{type(exc).__name__}: {exc}"
        ctx.emit("log", traceback.format_exc(), level="error")
    seconds = round(time.perf_counter() - t0, 3)
    report["seconds"][stage] = seconds
    if section is not None:
        report["stages"][stage] = section
        ctx.results[stage] = section
        ctx.emit("result", f"{stage} section", data={"stage": stage, "section": section})
    passed = error is None
    ctx.emit(
        "stage_finished",
        f"{stage} passed in {seconds:.1f} s" if passed else f"{stage} failed: {error}",
        level="info" if passed else ("warning" if error == "cancelled" else "error"),
        data={"stage": stage, "passed": passed, "seconds": seconds, "error": error},
    )
    return error
