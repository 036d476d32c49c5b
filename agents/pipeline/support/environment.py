"""The environment the evidence is produced in — runtime commit, torch, Python, driver and toolkit, device name
and count, dispatch key, CPU model — so a result can be reproduced (the ``env`` stage's section; an agent also
reports it with its heartbeat)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from contract.version_lock import locked_environment

_REPO_ROOT = Path(__file__).resolve().parents[3]


def _run(cmd: list[str], cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def runtime_commit() -> dict[str, Any]:
    """The runtime's git commit (and whether the tree is dirty), else the installed package version."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=_REPO_ROOT) if (_REPO_ROOT / ".git").exists() else None
    if commit:
        status = _run(["git", "status", "--porcelain", "--untracked-files=no", "--", "agents"], cwd=_REPO_ROOT)
        return {"runtime_commit": commit, "runtime_dirty": bool(status), "runtime_source": "git"}
    try:
        version = importlib.metadata.version("day0-portal")
    except importlib.metadata.PackageNotFoundError:
        version = None
    return {"runtime_commit": f"package:{version}" if version else None, "runtime_dirty": None,
            "runtime_source": "package" if version else None}


def cpu_model() -> str:
    """The CPU's marketing name from /proc/cpuinfo, else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def dispatch_key_for(device: str) -> str:
    """The dispatcher key whose kernels run on ``device`` (``cuda:1`` -> ``CUDA``; an out-of-tree backend
    registered as PrivateUse1 -> ``PrivateUse1``)."""
    import torch

    try:
        device_type = torch.device(device).type
        return str(torch._C._dispatch_key_for_device(device_type))
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"unknown device {device!r}: {exc}") from exc


def device_info(device: str) -> dict[str, Any]:
    """Name, count, driver and toolkit of the target device type."""
    import torch

    device_type = torch.device(device).type
    info: dict[str, Any] = {"device": None, "device_count": 0, "driver": None, "toolkit": None}
    if device_type == "cpu":
        info.update(device=cpu_model(), device_count=1, toolkit=None,
                    driver=f"{platform.system()} {platform.release()}")
    elif device_type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {device!r} requested but torch {torch.__version__} sees no CUDA device")
        info.update(device=torch.cuda.get_device_name(torch.device(device)), device_count=torch.cuda.device_count())
        info["toolkit"] = f"hip {torch.version.hip}" if torch.version.hip else f"cuda {torch.version.cuda}"
        smi = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        info["driver"] = smi.splitlines()[0] if smi else None
    else:
        backend = getattr(torch, device_type, None)
        count = getattr(backend, "device_count", None)
        name = getattr(backend, "get_device_name", None)
        info.update(device_count=int(count()) if callable(count) else 0,
                    device=str(name(0)) if callable(name) and callable(count) and count() else device_type)
    return info


def environment_lock(device: str = "cpu") -> dict[str, Any]:
    """The ``env`` section for ``device``."""
    import torch

    lock: dict[str, Any] = {}
    lock.update(runtime_commit())
    lock.update(
        torch=torch.__version__,
        python=platform.python_version(),
        python_implementation=platform.python_implementation(),
        platform=platform.platform(),
        dispatch_key=dispatch_key_for(device),
        target=device,
        cpu_model=cpu_model(),
        cpu_count=os.cpu_count(),
        executable=sys.executable,
        threads=torch.get_num_threads(),
        # threads, thread binding, allocators: part of the version lock (contract.version_lock)
        environment=locked_environment(os.environ),
    )
    lock.update(device_info(device))
    for package in ("transformers", "safetensors", "tokenizers", "numpy"):
        try:
            lock[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            lock[package] = None
    return lock
