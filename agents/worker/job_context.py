"""What a job's delivery becomes on this agent: the pipeline's ``StageContext`` of the job spec the payload
carries (as ``apps.jobs.dispatch`` builds it), and the ``NodeSpec`` of a multi-node job's node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents.worker.agent_state import STATE


def _model_dir(spec: dict[str, Any]) -> Path | None:
    """``--models-dir/<model-slug>``, else a path the job spec names (local demo models), else None."""
    model = spec.get("model") or {}
    candidates = []
    if STATE.models_dir and model.get("slug"):
        candidates.append(Path(STATE.models_dir) / model["slug"])
    if model.get("path"):
        candidates.append(Path(model["path"]))
    for path in candidates:
        if (path / "config.json").is_file():
            return path
    return None


def build_context(job_id: int, spec: dict[str, Any], emit_fn: Any) -> Any:
    """The ``StageContext`` of a job spec (as ``apps.jobs.dispatch`` builds it). The agent is not handed the
    release's manifest: its load reports each shard's digest and the portal compares; the spec's
    ``weight_samples`` (a reference run) or ``weight_probe`` (a certify job) go to the load stage."""
    from agents.pipeline.base import StageContext

    model_dir = _model_dir(spec)
    config = (spec.get("model") or {}).get("config")
    if model_dir is not None:
        config = json.loads((model_dir / "config.json").read_text())
    if not isinstance(config, dict):
        raise ValueError(f"job {job_id}: no model files and no config in the job spec")
    hardware = dict(spec.get("hardware") or {})
    hardware.setdefault("memory_gb", (hardware.get("memory_bytes") or 0) / 1e9)
    workdir = STATE.work_dir / f"job-{job_id}"
    workdir.mkdir(parents=True, exist_ok=True)
    for key in ("weight_samples", "weight_probe", "challenge", "reference_pool"):
        if spec.get(key) is not None and not isinstance(spec[key], dict):
            raise ValueError(f"job {job_id}: the delivery's {key} must be an object, got {type(spec[key]).__name__}")
    return StageContext(
        purpose=str(spec.get("purpose") or "certify"), nonce=spec.get("nonce") or None,
        challenge=spec.get("challenge"), reference_pool=spec.get("reference_pool"),
        model_dir=model_dir, config=config, hardware=hardware, dtype=spec.get("dtype") or "float32",
        device=STATE.device, tp=spec.get("tp"), ep=spec.get("ep"), pp=spec.get("pp"),
        thresholds=dict(spec.get("thresholds") or {}),
        bench=dict(spec.get("bench") or {}), workdir=workdir, emit_fn=emit_fn,
        weight_samples=spec.get("weight_samples"), weight_probe=spec.get("weight_probe"),
        node=node_of(job_id, spec),
    )


def node_of(job_id: int, spec: dict[str, Any]) -> Any:
    """The ``NodeSpec`` a multi-node job's delivery names (``spec["node"]``), or None for one host; a
    ValueError names a malformed one."""
    node = spec.get("node")
    if node is None:
        return None
    from agents.runtime.nodes import NodeSpec

    if not isinstance(node, dict):
        raise ValueError(f"job {job_id}: the delivery's node must be an object, got {type(node).__name__}")
    try:
        return NodeSpec(node.get("nnodes"), node.get("node_rank"), node.get("master_addr"),
                        node.get("master_port"), float(spec.get("rendezvous_timeout") or 600))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"job {job_id}: the delivery's node is not valid: {exc}") from None
