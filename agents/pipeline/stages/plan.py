"""The ``plan`` stage: the model's spec, parameter counts, weight and KV bytes and the smallest TP × PP × EP plan
that fits the job's hardware, from ``config.json`` alone (no weights, no torch).

A model that does not fit returns its section with ``fits: false`` and an ``error`` that says by how much, so the
report keeps the evidence (the runner stops there and reports that error). A config or hardware description that
cannot be planned raises ``StageFailed`` naming what is wrong."""

from __future__ import annotations

from typing import Any

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed


def hardware_memory(hardware: Any) -> tuple[dict[str, Any], int, int]:
    """(hardware as a dict, memory bytes per device, devices per node) from ``ctx.hardware``: a dict with
    ``memory_bytes`` or ``memory_gb`` (decimal GB), or only a ``slug`` of the catalog (or ``"cpu"``), or a
    HardwareSpec."""
    from contract.hardware import get_hardware

    if hasattr(hardware, "to_dict"):
        hardware = hardware.to_dict()
    if not isinstance(hardware, dict) or not hardware:
        raise StageFailed("plan needs the target hardware (a slug or memory per device), but the job has none")
    hw = dict(hardware)
    if hw.get("memory_bytes") is None and hw.get("memory_gb") is None:
        slug = hw.get("slug")
        if not slug:
            raise StageFailed("hardware has neither memory_bytes, memory_gb nor a catalog slug")
        try:
            hw = {**get_hardware(slug).to_dict(), **{k: v for k, v in hw.items() if v is not None}}
        except KeyError as exc:
            raise StageFailed(str(exc.args[0])) from exc
    try:
        memory = int(hw["memory_bytes"]) if hw.get("memory_bytes") is not None else int(float(hw["memory_gb"]) * 1e9)
        per_node = int(hw.get("devices_per_node") or 1)
    except (TypeError, ValueError) as exc:
        raise StageFailed(f"hardware memory/devices_per_node are not numbers: {exc}") from exc
    if memory <= 0 or per_node <= 0:
        raise StageFailed(f"hardware memory ({memory} bytes) and devices_per_node ({per_node}) must be positive")
    return hw, memory, per_node


def _positive(name: str, value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise StageFailed(f"plan override {name}={value!r} must be a positive integer")
    return value


def run(ctx: StageContext) -> dict[str, Any]:
    """Plan ``ctx.config`` on ``ctx.hardware`` at ``ctx.dtype``, pinning ``ctx.tp``/``ctx.ep`` when given."""
    from contract.model.spec import SpecError
    from contract.planner import plan_report

    hw, memory, per_node = hardware_memory(ctx.hardware)
    tp, ep, pp = _positive("tp", ctx.tp), _positive("ep", ctx.ep), _positive("pp", ctx.pp)
    max_nodes = int(hw.get("max_nodes") or ctx.thresholds.get("max_nodes", 16))
    try:
        section = plan_report(
            ctx.config, memory_bytes=memory, devices_per_node=per_node, dtype=ctx.dtype, max_nodes=max_nodes,
            shared_memory=bool(hw.get("shared_memory")), tp=tp, ep=ep, pp=pp, hardware_dtypes=hw.get("dtypes") or None,
        )
    except (SpecError, ValueError) as exc:
        raise StageFailed(f"cannot plan this model: {exc}") from exc
    section["hardware"] = hw.get("slug")
    if section["plan"] is None:
        pinned = ", ".join(f"{k}={v}" for k, v in (("tp", tp), ("ep", ep), ("pp", pp)) if v)
        raise StageFailed(f"no valid plan with {pinned or 'these settings'}: {section.get('message', '')}".rstrip())
    plan = section["plan"]
    gib = 1 << 30
    if section["fits"]:
        ctx.emit("log", f"plan tp={plan['tp']} pp={plan['pp']} ep={plan['ep']} on {plan['devices']} device(s): "
                        f"{section['bytes_per_device'] / gib:.2f} of {section['memory_per_device'] / gib:.2f} GiB per "
                        f"device, up to {section['max_context']} tokens × batch {section['max_batch']}")
    else:
        section["error"] = section.get("message") or "the model does not fit"
        ctx.emit("log", section["error"], level="error")
    for warning in section.get("warnings", []):
        ctx.emit("log", warning, level="warning")
    return section
