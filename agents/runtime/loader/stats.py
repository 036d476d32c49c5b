"""Per-tensor statistics gathered while streaming, and process memory figures."""

from __future__ import annotations

import resource

import torch


def tensor_stats(t: torch.Tensor) -> dict[str, float | int]:
    """mean, std (population), absmax, NaN and Inf counts; counting runs only when something is non-finite."""
    if t.numel() == 0:
        return {"mean": 0.0, "std": 0.0, "absmax": 0.0, "nan": 0, "inf": 0}
    x = t if t.dtype in (torch.float32, torch.float64) else t.float()
    std, mean = torch.std_mean(x, correction=0)
    lo, hi = torch.aminmax(x)
    absmax = max(-float(lo), float(hi))
    nan = inf = 0
    if not (torch.isfinite(mean) and torch.isfinite(std) and abs(absmax) != float("inf")) or absmax != absmax:
        nan = int(torch.isnan(x).sum())
        inf = int(torch.isinf(x).sum())
        finite = x[torch.isfinite(x)]
        if finite.numel():
            std, mean = torch.std_mean(finite, correction=0)
            absmax = float(finite.abs().max())
        else:
            std = mean = torch.tensor(0.0)
            absmax = 0.0
    return {"mean": float(mean), "std": float(std), "absmax": absmax, "nan": nan, "inf": inf}


def _status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def current_rss() -> int:
    return _status_bytes("VmRSS") or 0


def reset_peak_rss() -> bool:
    """Reset the kernel's RSS high-water mark (Linux), so the peak measures this load only."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int:
    hwm = _status_bytes("VmHWM")
    return hwm if hwm is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
