"""Per-tensor statistics gathered while streaming, and process memory figures."""

from __future__ import annotations

import math
import resource

import torch

CHUNK = 1 << 18  # elements per pass (1 MiB of fp32): a chunk stays in cache across the three reductions


def tensor_stats(t: torch.Tensor) -> dict[str, float | int]:
    """mean, std (population), absmax, NaN and Inf counts. Reductions run chunk by chunk (sum, sum of squares,
    max |x|) so each chunk is read from memory once; NaN/Inf are counted only when something is non-finite."""
    n = t.numel()
    if n == 0:
        return {"mean": 0.0, "std": 0.0, "absmax": 0.0, "nan": 0, "inf": 0}
    flat = t.reshape(-1)
    total = sq = 0.0  # chunk sums in fp32, accumulated in Python floats (fp64)
    absmax = 0.0
    for start in range(0, n, CHUNK):
        chunk = flat[start : start + CHUNK]
        if chunk.dtype != torch.float32:
            chunk = chunk.float()
        total += float(chunk.sum())
        sq += float(torch.dot(chunk, chunk))
        lo, hi = torch.aminmax(chunk)  # NaN propagates, so a non-finite chunk shows up here
        absmax = max(absmax, -float(lo), float(hi))
    if math.isfinite(total) and math.isfinite(sq) and math.isfinite(absmax):
        mean = total / n
        return {"mean": mean, "std": math.sqrt(max(sq / n - mean * mean, 0.0)), "absmax": absmax, "nan": 0, "inf": 0}
    x = flat.float()
    finite = x[torch.isfinite(x)]
    std, mean = torch.std_mean(finite, correction=0) if finite.numel() else (torch.tensor(0.0), torch.tensor(0.0))
    return {"mean": float(mean), "std": float(std), "absmax": float(finite.abs().max()) if finite.numel() else 0.0,
            "nan": int(torch.isnan(x).sum()), "inf": int(torch.isinf(x).sum())}


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
