"""Accelerator specs and the bundled catalogs (``data/hardware.json``, ``data/models.json``).

Units: ``memory_bytes`` per device in bytes; every ``*_gbps`` field is GB/s (gigabytes per second, per device,
one direction); ``peak_tflops`` maps a dtype name to dense (non-sparse) TFLOP/s (TOP/s for integers). ``None``
means unknown (the CPU host's interconnect and peaks).
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent / "data"
# the most memory bandwidth a device may state, GB/s: 100 PB/s, past wafer-scale on-chip SRAM (~21 PB/s); the
# bench's physics floor divides by it, so a larger figure would lift the floor rather than describe a device
MAX_MEMORY_BANDWIDTH_GBPS = 1e8


@dataclass
class HardwareSpec:
    """One accelerator kind. ``shared_memory``: every device of a node draws on the same memory (CPU
    processes), so a plan's devices split ``memory_bytes`` instead of each having it."""

    slug: str
    vendor: str
    name: str
    memory_bytes: int
    devices_per_node: int
    intra_node_gbps: float | None
    inter_node_gbps: float | None
    memory_bandwidth_gbps: float | None
    dtypes: list[str]
    peak_tflops: dict[str, float]
    operator_manifest: list[str] = field(default_factory=list)
    shared_memory: bool = False
    notes: str = ""

    def __post_init__(self) -> None:
        if not self.slug:
            raise ValueError("hardware slug must not be empty")
        if self.memory_bytes <= 0:
            raise ValueError(f"hardware {self.slug!r}: memory_bytes must be positive, got {self.memory_bytes}")
        if self.devices_per_node <= 0:
            raise ValueError(f"hardware {self.slug!r}: devices_per_node must be positive, got {self.devices_per_node}")

    @property
    def memory_gb(self) -> float:
        return self.memory_bytes / 1e9

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareSpec:
        """Build from a dict; accepts ``memory_gb`` (decimal GB) in place of ``memory_bytes``. Unknown keys are
        errors naming the key."""
        data = dict(data)
        if "memory_bytes" not in data and data.get("memory_gb") is not None:
            data["memory_bytes"] = int(float(data["memory_gb"]) * 1e9)
        data.pop("memory_gb", None)
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown hardware field(s): {', '.join(unknown)}")
        missing = [name for name in ("slug", "vendor", "name", "memory_bytes", "devices_per_node") if name not in data]
        if missing:
            raise ValueError(f"hardware spec is missing {', '.join(missing)}")
        data.setdefault("intra_node_gbps", None)
        data.setdefault("inter_node_gbps", None)
        data.setdefault("memory_bandwidth_gbps", None)
        data.setdefault("dtypes", [])
        data.setdefault("peak_tflops", {})
        return cls(**data)


@lru_cache(maxsize=1)
def _catalog_rows() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads((DATA_DIR / "hardware.json").read_text()))


def load_catalog() -> dict[str, HardwareSpec]:
    """Every accelerator in ``data/hardware.json`` by slug (``cpu`` is not in it: see ``get_hardware``)."""
    return {row["slug"]: HardwareSpec.from_dict(row) for row in _catalog_rows()}


def _meminfo_bytes(key: str = "MemTotal") -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError) as exc:
        raise RuntimeError("cannot read this host's memory size") from exc


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_hardware() -> HardwareSpec:
    """This host as one device: memory is MemTotal from /proc/meminfo; peaks and bandwidths unknown."""
    model = _cpu_model()
    vendor = "AMD" if "AMD" in model else "Intel" if "Intel" in model else platform.machine()
    return HardwareSpec(
        slug="cpu", vendor=vendor, name=f"CPU ({model}, {os.cpu_count()} threads)", memory_bytes=_meminfo_bytes(),
        devices_per_node=1, intra_node_gbps=None, inter_node_gbps=None, memory_bandwidth_gbps=None,
        dtypes=["float32", "bfloat16", "float16"], peak_tflops={}, shared_memory=True,
        notes="this host; TP/EP ranks are processes sharing its memory",
    )


def get_hardware(slug: str) -> HardwareSpec:
    """The catalog entry for ``slug``; ``"cpu"`` is this host. KeyError naming the slug when unknown."""
    if slug == "cpu":
        return cpu_hardware()
    catalog = load_catalog()
    if slug not in catalog:
        raise KeyError(f"unknown hardware {slug!r}; known: cpu, {', '.join(sorted(catalog))}")
    return catalog[slug]


@lru_cache(maxsize=1)
def _model_rows() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads((DATA_DIR / "models.json").read_text()))


def load_model_catalog() -> list[dict[str, Any]]:
    """The real public models of ``data/models.json``, each with its parsed ``config`` dict inline."""
    out = []
    for row in _model_rows():
        entry = dict(row)
        entry["config"] = json.loads((DATA_DIR / row["config"]).read_text())
        out.append(entry)
    return out


def find_config(slug: str) -> dict[str, Any] | None:
    """A bundled config by slug (catalog models and the synthetic ones under ``data/configs``), else None."""
    path = DATA_DIR / "configs" / f"{slug}.json"
    if "/" in slug or not path.is_file():
        return None
    return json.loads(path.read_text())
