"""What the compiled path cost and did (``CompileStats``): compile seconds, graphs, graph breaks, recompiles after
the warm-up, and the hits and misses of Inductor's FX graph cache and the AOT autograd cache."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

CACHE_COUNTERS = (  # (counters group, key): the compilation caches' outcomes
    ("inductor", "fxgraph_cache_hit"), ("inductor", "fxgraph_cache_miss"), ("inductor", "fxgraph_cache_bypass"),
    ("aot_autograd", "autograd_cache_hit"), ("aot_autograd", "autograd_cache_miss"),
    ("aot_autograd", "autograd_cache_bypass"), ("aot_autograd", "autograd_cache_saved"),
)
MAX_REASONS = 10  # graph-break and recompile reasons kept (each cut to REASON_CHARS)
REASON_CHARS = 300


def counter_snapshot() -> dict[str, int]:
    from torch._dynamo.utils import counters

    snap = {f"{group}.{key}": int(counters[group][key]) for group, key in CACHE_COUNTERS}
    snap["graphs"] = int(counters["stats"]["unique_graphs"])
    snap["graph_breaks"] = int(sum(counters["graph_break"].values()))
    return snap


def graph_count() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


@dataclass
class CompileStats:
    """What the compiled path did in this process (``report()`` is the server's ``/stats/compile`` body)."""

    backend: str = "inductor"
    dynamic: bool = True
    device: str = "cpu"
    cache_dir: str | None = None
    compiler: str | None = None
    compiled_region: str = "DecoderLayer.forward"
    layers: int = 0
    compile_seconds: float = 0.0
    compiling_calls: int = 0
    steps: int = 0
    warm: bool = False  # the warm-up is over: any graph compiled later is a recompile in service
    recompiles_after_warmup: int = 0
    baseline: dict[str, int] = field(default_factory=dict)
    warmup_counts: dict[str, int] | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def deltas(self) -> dict[str, int]:
        now = counter_snapshot()
        return {k: now[k] - self.baseline.get(k, 0) for k in now}

    def report(self) -> dict[str, Any]:
        from torch._dynamo.utils import counters, guard_failures

        d = self.deltas()
        breaks = sorted(counters["graph_break"].items(), key=lambda kv: -kv[1])[:MAX_REASONS]
        reasons = [str(r)[:REASON_CHARS] for failures in guard_failures.values() for r in failures][:MAX_REASONS]
        return {
            "enabled": True,
            "backend": self.backend,
            "dynamic": self.dynamic,
            "device": self.device,
            "compiled_region": self.compiled_region,
            "layers": self.layers,
            "compiler": self.compiler,
            "cache_dir": self.cache_dir,
            "compile_seconds": round(self.compile_seconds, 3),
            "compiling_calls": self.compiling_calls,
            "steps": self.steps,
            "graphs": d["graphs"],
            "graph_breaks": d["graph_breaks"],
            "graph_break_reasons": [{"reason": str(r)[:REASON_CHARS], "count": int(n)} for r, n in breaks],
            "recompiles_after_warmup": self.recompiles_after_warmup,
            "recompile_reasons": reasons,
            "cache": {
                "fxgraph_hit": d["inductor.fxgraph_cache_hit"],
                "fxgraph_miss": d["inductor.fxgraph_cache_miss"],
                "fxgraph_bypass": d["inductor.fxgraph_cache_bypass"],
                "aot_autograd_hit": d["aot_autograd.autograd_cache_hit"],
                "aot_autograd_miss": d["aot_autograd.autograd_cache_miss"],
                "aot_autograd_bypass": d["aot_autograd.autograd_cache_bypass"],
                "aot_autograd_saved": d["aot_autograd.autograd_cache_saved"],
            },
            "warmup": self.warmup_counts,
        }
