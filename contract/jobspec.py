"""The job spec: what the portal sends an agent with ``RUN_JOB_TASK`` (``contract.queues``) and the agent reads.

The portal builds it from the job row (``apps.jobs.dispatch.task_payload``: the job's own spec, then ``job``,
``attempt``, ``nonce``, ``purpose``, the challenge or reference pool, ``model``, ``hardware`` and the weight
challenge) and checks it with ``validate`` before it publishes; the agent reads it with ``JobSpec.from_dict``.
Every key but ``model`` may be absent (a spec from an older portal): each has its default here. Keys this module
does not name travel on unchanged in ``JobSpec.extra`` (``model_path``, ``revalidation`` …), so the portal can
add one before the agents read it. A key of the wrong type is a ``JobSpecError`` naming it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from contract.engines import check_spec_engine

PURPOSES = ("certify", "reference")
DEFAULT_PURPOSE = "certify"
DEFAULT_DTYPE = "float32"  # an agent's dtype when the spec names none
MODEL_KEYS = ("slug", "name", "architecture", "config", "path")
HARDWARE_KEYS = ("slug", "vendor", "name", "memory_bytes", "memory_gb", "devices_per_node", "intra_node_gbps",
                 "inter_node_gbps", "memory_bandwidth_gbps", "dtypes", "peak_tflops", "operator_manifest")
NODE_KEYS = ("nnodes", "node_rank", "master_addr", "master_port", "agent")
# the objects a spec may carry (each None when absent): the portal's challenge of a certify attempt, the pool a
# reference job answers, the weight challenge (a reference run's samples or a certify job's probe), the node of a
# multi-node job
OBJECT_KEYS = ("challenge", "reference_pool", "weight_samples", "weight_probe", "node")


class JobSpecError(ValueError):
    """A job spec key has the wrong type; ``field`` names it (``model.config``, ``tp``)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name} {message}")
        self.field = field_name


def _kind(value: Any) -> str:
    return type(value).__name__


def _object(data: Mapping[str, Any], key: str, where: str = "") -> dict[str, Any] | None:
    value = data.get(key)
    if value is not None and not isinstance(value, Mapping):
        raise JobSpecError(where + key, f"must be an object, got {_kind(value)}")
    return None if value is None else dict(value)


def _text(data: Mapping[str, Any], key: str, where: str = "") -> str | None:
    value = data.get(key)
    if value is not None and not isinstance(value, str):
        raise JobSpecError(where + key, f"must be a string, got {_kind(value)}")
    return value


def _integer(data: Mapping[str, Any], key: str, where: str = "", minimum: int | None = None) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise JobSpecError(where + key, f"must be an integer, got {_kind(value)}")
    if minimum is not None and value < minimum:
        raise JobSpecError(where + key, f"must be at least {minimum}, got {value}")
    return value


def _number(data: Mapping[str, Any], key: str, where: str = "") -> float | None:
    value = data.get(key)
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise JobSpecError(where + key, f"must be a number, got {_kind(value)}")
    return value


def _model(data: Mapping[str, Any]) -> dict[str, Any]:
    model = _object(data, "model") or {}
    for key in ("slug", "name", "architecture", "path"):
        _text(model, key, "model.")
    _object(model, "config", "model.")
    return model


def _hardware(data: Mapping[str, Any]) -> dict[str, Any]:
    hardware = _object(data, "hardware") or {}
    for key in ("slug", "vendor", "name"):
        _text(hardware, key, "hardware.")
    _integer(hardware, "memory_bytes", "hardware.", minimum=0)
    _integer(hardware, "devices_per_node", "hardware.", minimum=1)
    for key in ("memory_gb", "intra_node_gbps", "inter_node_gbps", "memory_bandwidth_gbps"):
        _number(hardware, key, "hardware.")
    for key in ("dtypes", "operator_manifest"):
        if hardware.get(key) is not None and not isinstance(hardware[key], list):
            raise JobSpecError(f"hardware.{key}", f"must be a list, got {_kind(hardware[key])}")
    _object(hardware, "peak_tflops", "hardware.")
    return hardware


def _stages(data: Mapping[str, Any]) -> list[str] | None:
    stages = data.get("stages")
    if stages is None:
        return None
    if not isinstance(stages, list) or not all(isinstance(s, str) for s in stages):
        raise JobSpecError("stages", f"must be a list of stage names, got {stages!r:.80}")
    return list(stages)


def _thresholds(data: Mapping[str, Any]) -> dict[str, float]:
    thresholds = _object(data, "thresholds") or {}
    for key in thresholds:
        _number(thresholds, key, "thresholds.")
    return thresholds


def _engine(data: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        return check_spec_engine(data.get("engine"))
    except ValueError as exc:
        raise JobSpecError("engine", str(exc)) from None


@dataclass(frozen=True)
class JobSpec:
    """A job spec as the agent reads it. ``stages`` None: the default stages (``contract.tiers.DEFAULT_STAGES``)."""

    model: dict[str, Any]
    hardware: dict[str, Any] = field(default_factory=dict)
    job: int | None = None
    attempt: int | None = None
    nonce: str | None = None
    purpose: str = DEFAULT_PURPOSE
    stages: list[str] | None = None
    dtype: str = DEFAULT_DTYPE
    tp: int | None = None
    pp: int | None = None
    ep: int | None = None
    thresholds: dict[str, float] = field(default_factory=dict)
    bench: dict[str, Any] = field(default_factory=dict)
    challenge: dict[str, Any] | None = None
    reference_pool: dict[str, Any] | None = None
    weight_samples: dict[str, Any] | None = None
    weight_probe: dict[str, Any] | None = None
    node: dict[str, Any] | None = None
    rendezvous_timeout: float | None = None
    engine: dict[str, Any] | None = None  # {name, version, command}; None: the bundled runtime (contract.engines)
    extra: dict[str, Any] = field(default_factory=dict)  # keys this module does not name, as sent

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobSpec:
        """The spec of a payload; a ``JobSpecError`` names the first key of the wrong type."""
        if not isinstance(data, Mapping):
            raise JobSpecError("spec", f"must be an object, got {_kind(data)}")
        purpose = _text(data, "purpose") or DEFAULT_PURPOSE
        if purpose not in PURPOSES:
            raise JobSpecError("purpose", f"must be one of {', '.join(PURPOSES)}, got {purpose!r}")
        objects = {key: _object(data, key) for key in OBJECT_KEYS}
        named = {f.name for f in cls.__dataclass_fields__.values()} - {"extra"}
        return cls(
            model=_model(data), hardware=_hardware(data), job=_integer(data, "job"),
            attempt=_integer(data, "attempt"), nonce=_text(data, "nonce") or None, purpose=purpose,
            stages=_stages(data), dtype=_text(data, "dtype") or DEFAULT_DTYPE,
            tp=_integer(data, "tp", minimum=1), pp=_integer(data, "pp", minimum=1), ep=_integer(data, "ep", minimum=1),
            thresholds=_thresholds(data), bench=_object(data, "bench") or {},
            rendezvous_timeout=_number(data, "rendezvous_timeout"), engine=_engine(data), **objects,
            extra={k: v for k, v in data.items() if k not in named},
        )


def validate(data: Mapping[str, Any]) -> None:
    """Raises a ``JobSpecError`` naming the first key of ``data`` an agent could not read."""
    JobSpec.from_dict(data)
