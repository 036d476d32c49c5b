"""What a job's delivery becomes on this agent: the pipeline's ``StageContext`` of the job spec the payload
carries (as ``apps.jobs.dispatch`` builds it), and the ``NodeSpec`` of a multi-node job's node."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agents.worker.agent_state import STATE
from contract.jobspec import JobSpec, JobSpecError


def _model_dir(spec: dict[str, Any]) -> Path | None:
    """``--models-dir/<model-slug>``, else a path the job spec names (local demo models), else None."""
    model = spec.get("model") or {}
    candidates = []
    if STATE.models_dir and model.get("slug"):
        candidates.append(Path(STATE.models_dir) / model["slug"])
    if model.get("path"):
        candidates.append(Path(model["path"]))
    for path in candidates:
        if (path / "config.json").is_file() or (path.is_dir() and any(path.glob("*.gguf"))):
            return path
    return None


def read_spec(job_id: int, spec: dict[str, Any]) -> JobSpec:
    """The delivery's job spec (``contract.jobspec``); a ValueError names the job and the malformed key."""
    try:
        return JobSpec.from_dict(spec)
    except JobSpecError as exc:
        raise ValueError(f"job {job_id}: the delivery's {exc}") from None


def build_context(job_id: int, spec: dict[str, Any], emit_fn: Any) -> Any:
    """The ``StageContext`` of a job spec (as ``apps.jobs.dispatch`` builds it). The agent is not handed the
    release's manifest: its load reports each shard's digest and the portal compares; the spec's
    ``weight_samples`` (a reference run) or ``weight_probe`` (a certify job) go to the load stage."""
    from agents.pipeline.support.context import StageContext

    job = read_spec(job_id, spec)
    model_dir = _model_dir(spec)
    config = job.model.get("config")
    if model_dir is not None and (model_dir / "config.json").is_file():
        config = json.loads((model_dir / "config.json").read_text())
    elif model_dir is not None:  # a GGUF-only release: its config from the file's metadata
        from agents.runtime.loader import LoadError
        from agents.runtime.loader.gguf_release import release_config

        try:
            config = release_config(model_dir)
        except LoadError as exc:
            raise ValueError(f"job {job_id}: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"job {job_id}: no model files and no config in the job spec")
    hardware = dict(job.hardware)
    hardware.setdefault("memory_gb", (hardware.get("memory_bytes") or 0) / 1e9)
    workdir = STATE.work_dir / f"job-{job_id}"
    workdir.mkdir(parents=True, exist_ok=True)
    return StageContext(
        purpose=job.purpose, nonce=job.nonce, challenge=job.challenge, reference_pool=job.reference_pool,
        model_dir=model_dir, config=config, hardware=hardware, dtype=job.dtype,
        device=STATE.device, tp=job.tp, ep=job.ep, pp=job.pp, thresholds=dict(job.thresholds),
        bench=dict(job.bench), workdir=workdir, emit_fn=emit_fn,
        weight_samples=job.weight_samples, weight_probe=job.weight_probe, node=node_of(job_id, spec),
        engine=job.engine,
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
