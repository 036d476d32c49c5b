"""``plan_report``: the ``plan`` section of the stage report (``day0 adapt --report``), from a config dict alone."""

from __future__ import annotations

import json
from functools import lru_cache
from typing import Any

from contract.model.native import FALLBACK_LAYOUT, config_runtime_path
from contract.model.params import ParamCount, count_params
from contract.model.spec import ModelSpec, parse_config
from contract.planner import search as _candidates
from contract.planner.formats import emulated_reason, format_bits, native_type
from contract.planner.memory import PlanSettings, kv_bytes_per_token, resolve_dtype, weight_bytes

# The per-model part of a plan (parse, count, per-layer bytes) is O(layers); the per-hardware part is O(candidate
# plans × pipeline stages). A matrix refresh plans one model on every hardware (or one hardware for every model),
# so the per-model part is computed once per (config, dtype, settings) and reused for each hardware.
PREPARED_CACHE_SIZE = 64


def runtime_layouts(config: Any) -> dict[str, Any]:
    """The ``runtime`` block of the plan: which code runs the model (``contract/model/native.py``, from the config
    alone) and so which layouts can run: a native family any TP × PP × EP within the rules, the transformers
    fallback one device."""
    path, reason = config_runtime_path(config)
    layouts = "any TP × PP × EP within the deployment rules" if path == "native" else FALLBACK_LAYOUT
    return {"path": path, "reason": reason, "layouts": layouts}


def quant_block(counts: ParamCount, dtype: str, keep: bool | str,
                hardware_dtypes: list[str] | None) -> dict[str, Any]:
    """The ``quant`` block of a quantised plan: the format, its true bytes (packed values + scales + zero points),
    and, given the hardware's declared dtypes, whether it runs ``native`` (the hardware declares the element type
    AND the runtime has a native path for the format: FP8 per tensor/channel) or ``emulated`` with the ``reason``
    (the runtime dequantizes the packed weights at load into bfloat16: ``runtime_bytes`` is what that takes). Empty for 16/32-bit."""
    if format_bits(dtype)[0] >= 16:
        return {}
    block: dict[str, Any] = {"format": dtype, "bytes": weight_bytes(counts, dtype, keep), "mode": "unknown"}
    if hardware_dtypes:
        declared = {d.removesuffix("uz") for d in hardware_dtypes}  # AMD's fnuz FP8 runs the fn format
        reason = emulated_reason(dtype, native_type(dtype) in declared)
        block["mode"] = "native" if reason is None else "emulated"
        if reason:
            block["reason"] = reason
    if block["mode"] == "emulated":
        block["how"] = "dequantized at load to bfloat16"
        block["runtime_bytes"] = weight_bytes(counts, "bfloat16", keep)
    else:
        block["runtime_bytes"] = block["bytes"]
    return block


def _build(config: Any, dtype: str, settings: PlanSettings,
           keep_attention: bool | str) -> tuple[ModelSpec, ParamCount, _candidates.Model, dict[str, Any]]:
    spec = parse_config(config)
    counts = count_params(spec)
    runtime = runtime_layouts(config)
    single = f"{runtime['reason']}: {FALLBACK_LAYOUT}" if runtime["path"] == "fallback" else None
    return spec, counts, _candidates.Model.build(spec, counts, dtype, settings, keep_attention, single), runtime


@lru_cache(maxsize=PREPARED_CACHE_SIZE)
def _prepared(config_json: str, dtype: str, settings: PlanSettings,
              keep_attention: bool | str) -> tuple[ModelSpec, ParamCount, _candidates.Model, dict[str, Any]]:
    return _build(json.loads(config_json), dtype, settings, keep_attention)


def _prepare(config: Any, dtype: str, settings: PlanSettings,
             keep_attention: bool | str) -> tuple[ModelSpec, ParamCount, _candidates.Model, dict[str, Any]]:
    try:
        key = json.dumps(config, sort_keys=True, allow_nan=True)
    except (TypeError, ValueError):  # not JSON data (a caller's own objects): plan it uncached
        return _build(config, dtype, settings, keep_attention)
    return _prepared(key, dtype, settings, keep_attention)


def plan_report(
    config: dict[str, Any],
    *,
    memory_bytes: int,
    devices_per_node: int,
    dtype: str = "bfloat16",
    max_nodes: int = 16,
    shared_memory: bool = False,
    tp: int | None = None,
    pp: int | None = None,
    ep: int | None = None,
    settings: PlanSettings | None = None,
    hardware_dtypes: list[str] | None = None,
) -> dict[str, Any]:
    """The ``plan`` section of the stage report for ``config`` on devices of ``memory_bytes`` each.

    ``dtype`` may be ``"auto"``: the checkpoint's own format (see ``resolve_dtype``). ``tp``/``pp``/``ep`` pin those degrees (the others are still searched). ``shared_memory``: the devices of a
    node share ``memory_bytes`` (CPU processes). SpecError/ValueError on a bad config, dtype or setting."""
    if memory_bytes <= 0 or devices_per_node <= 0:
        raise ValueError(f"memory_bytes and devices_per_node must be positive, got {memory_bytes}, "
                         f"{devices_per_node}")
    dtype, keep_attention = resolve_dtype(dtype, config) if isinstance(config, dict) else (dtype, False)
    settings = settings or PlanSettings(max_nodes=max_nodes)
    if settings.max_nodes != max_nodes:
        settings = PlanSettings(**{**settings.__dict__, "max_nodes": max_nodes})
    spec, counts, ctx, runtime = _prepare(config, dtype, settings, keep_attention)
    hw = _candidates.Devices(memory_bytes, devices_per_node, shared_memory)
    plans = _candidates.search(ctx, hw, fixed={"tp": tp, "pp": pp, "ep": ep})
    chosen = _candidates.choose(plans)
    warnings = list(spec.warnings)
    quant = quant_block(counts, dtype, keep_attention, hardware_dtypes)
    if hardware_dtypes and quant.get("mode") == "emulated":
        warnings.append(f"{dtype} runs emulated on this hardware: {quant['reason']}")
    elif hardware_dtypes and not quant and dtype not in hardware_dtypes:
        warnings.append(f"{dtype} is not a native dtype of this hardware ({', '.join(hardware_dtypes)})")
    per_device = chosen.memory_per_device if chosen else memory_bytes
    report: dict[str, Any] = {
        "architecture": spec.architecture,
        "family": spec.family,
        "params_total": counts.total,
        "params_active": counts.active,
        "weight_bytes": weight_bytes(counts, dtype, keep_attention),
        "kv_bytes_per_token": kv_bytes_per_token(spec, dtype),
        "dtype": dtype,
        "memory_per_device": per_device,
        "devices_per_node": devices_per_node,
        "headroom": settings.headroom,
        "context_length": spec.context_length,
        "plan": None,
        "fits": False,
        "bytes_per_device": None,
        "max_context": 0,
        "max_batch": 0,
        "candidates": [plan.to_dict() for plan in _candidates.summary(plans, chosen)],
        "warnings": warnings,
        "spec": spec.to_dict(),
        "runtime": dict(runtime),
    }
    if quant:
        report["quant"] = quant
    if counts.vision:  # the vision tower and projector: whole on each device of the first stage
        report["vision_bytes_per_device"] = int(ctx.vision_bytes)
    if chosen is None:
        report["message"] = "no candidate plan satisfies the divisibility rules for the pinned degrees"
        try:  # name the rule the pins break
            _candidates.check_layout(spec, hw, tp, pp, ep, max_nodes=max_nodes, single_device=ctx.single_device)
        except ValueError as exc:
            report["message"] += f": {exc}"
        return report
    report.update(chosen.to_dict(top_level=True))
    if not chosen.fits and ctx.single_device:  # no larger layout to propose: the runtime cannot run one
        gib = 1 << 30
        report["message"] = (f"does not fit one device: {ctx.single_device}, and at {dtype} one device needs "
                             f"{chosen.bytes_per_device / gib:.2f} GiB but {chosen.usable_per_device / gib:.2f} GiB "
                             f"are usable: short by {chosen.shortfall_bytes / gib:.2f} GiB")
    elif not chosen.fits:
        report["message"] = (f"{chosen.shortfall_message()} (searched plans on up to {max_nodes} node(s) of "
                             f"{devices_per_node} device(s) at {dtype})")
    return report

