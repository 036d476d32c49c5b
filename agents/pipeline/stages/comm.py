"""The ``comm`` stage: the collectives of the job's layout over its ranks (gloo processes on CPU, NCCL on CUDA),
for every dtype the hardware lists — conformance against a reference each rank computes locally, bandwidth as
nccl-tests defines it over a message-size sweep, and per-iteration latency percentiles.

Sizes follow nccl-tests: ``bytes`` is the whole buffer of the operation (all_reduce and broadcast: the buffer;
all_gather: the gathered output; reduce_scatter: the input every rank reduces; all_to_all: each rank's send
buffer; send_recv: the message). ``algbw = bytes / time`` (mean of the iterations) and ``busbw = algbw × factor``
with the factor of each op (``BUS_FACTORS``), so busbw is comparable with the link's bandwidth at any rank count.

Inputs are small integers (exact in every float dtype, so a sum is the same in any order), laid out per rank and
element so that a value in the wrong place or from the wrong rank is caught. A collective that does not finish
within ``op_timeout_s`` fails the stage naming it: the process group's own timeout raises on the rank, and a
watchdog in the parent kills every rank when one is stuck past the bound (a backend that ignores timeouts)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.nodes import stage_node
from agents.pipeline.support.server import stop_server

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
REDUCING = frozenset({"all_reduce", "reduce_scatter"})
MIB = 1 << 20
DEFAULT_MAX_BYTES = 256 * MIB
# CPU ranks share the host's cores (gloo over loopback): the sweep there proves conformance and shows latency;
# a job may raise it with comm_max_bytes
DEFAULT_CPU_MAX_BYTES = 4 * MIB
MAX_RANKS = 64
# CPU ranks are processes sharing this host's cores: enough to prove conformance, not to measure a fabric
MAX_CPU_RANKS = 8
STARTUP_BOUND_S = 180.0  # spawning ranks and joining the group (imports of torch dominate)


def bus_factor(op: str, n: int) -> float:
    """nccl-tests' busbw factor: the share of the buffer each rank's link carries."""
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


@dataclass(frozen=True)
class CommSettings:
    """What to measure; every field checked on construction. ``max_bytes`` caps the sweep (a job option)."""

    ops: tuple[str, ...]
    dtypes: tuple[str, ...]
    min_bytes: int = 1024
    max_bytes: int = DEFAULT_MAX_BYTES
    factor: int = 4
    iters: int = 20
    warmup: int = 3
    op_timeout_s: float = 60.0
    watchdog_grace_s: float = 15.0  # past the group's own timeout: ranks that did not raise by then are stuck

    def __post_init__(self) -> None:
        unknown = [op for op in self.ops if op not in COLLECTIVES]
        if unknown:
            raise ValueError(f"unknown collective(s) {unknown}; collectives are {', '.join(COLLECTIVES)}")
        if not 8 <= self.min_bytes <= self.max_bytes <= 1 << 34:
            raise ValueError(f"comm sizes must satisfy 8 <= min_bytes ({self.min_bytes}) <= max_bytes "
                             f"({self.max_bytes}) <= 16 GiB")
        if not 2 <= self.factor <= 1024:
            raise ValueError(f"comm_factor={self.factor} must be from 2 to 1024")
        if not 1 <= self.iters <= 10000 or not 0 <= self.warmup <= 1000:
            raise ValueError(f"comm_iters={self.iters} must be 1-10000 and comm_warmup={self.warmup} 0-1000")
        if not 0 < self.op_timeout_s <= 3600 or not 0 < self.watchdog_grace_s <= 600:
            raise ValueError(f"comm_timeout_s={self.op_timeout_s} must be in (0, 3600] (and the watchdog's grace "
                             f"{self.watchdog_grace_s} in (0, 600])")

    def sizes(self) -> list[int]:
        out, size = [], self.min_bytes
        while size <= self.max_bytes:
            out.append(size)
            size *= self.factor
        return out


# ---------------------------------------------------------------- one rank


def _torch_dtype(name: str) -> Any:
    """(storage dtype, whether reductions run in it) of a hardware dtype name; None when it is no storage
    dtype (tfloat32 is a matmul mode over float32 storage)."""
    import torch

    dtype = getattr(torch, name, None)
    if name.startswith("float4") and dtype is None:
        dtype = getattr(torch, name + "_x2", None)
    return dtype if isinstance(dtype, torch.dtype) else None


def _wire(dtype: Any) -> tuple[Any, bool]:
    """(dtype the case runs in, whether it is reduced): 8-bit floats and packed fp4 travel as bytes (the
    collectives that move data are dtype-blind, and the backends reduce no such dtype)."""
    import torch

    if dtype.itemsize == 1 and dtype not in (torch.int8, torch.uint8):
        return torch.uint8, False
    return dtype, True


def pattern(rank: int, start: int, count: int, dtype: Any, device: Any) -> Any:
    """Rank ``rank``'s input elements ``start .. start+count``: integers in [-8, 8], a function of rank and
    position (exact in every dtype; sums over 64 ranks stay exact in bfloat16)."""
    import torch

    idx = torch.arange(start, start + count, dtype=torch.int64, device=device)
    vals = (idx * 7 + rank * 13) % 17 - 8
    if dtype.is_floating_point:
        return vals.to(torch.float32).to(dtype)
    return vals.to(dtype) if dtype.is_signed else (vals + 8).to(dtype)


def a2a_split(src: int, dst: int, count: int, n: int) -> int:
    """Elements rank ``src`` sends rank ``dst`` in the all-to-all: uneven (weights 1..n), summing to ``count``."""
    weights = [1 + (src + j) % n for j in range(n)]
    base = [count * w // sum(weights) for w in weights]
    base[-1] += count - sum(base)
    return base[dst]


class _Case:
    """One (op, dtype, count) on this rank: its buffers, the collective, and the check against the reference."""

    def __init__(self, op: str, dtype: Any, count: int, rank: int, n: int, device: Any) -> None:
        import torch

        self.op, self.rank, self.n = op, rank, n
        acc = torch.float64 if dtype == torch.float64 else torch.float32 if dtype.is_floating_point else torch.int64
        chunk = count // n
        if op == "all_reduce":
            self.inp = pattern(rank, 0, count, dtype, device)
            self.out = torch.empty_like(self.inp)
            ref = sum(pattern(r, 0, count, acc, device) for r in range(n))
            self.ref = ref.to(dtype)
        elif op == "all_gather":
            self.inp = pattern(rank, rank * chunk, chunk, dtype, device)
            self.out = torch.empty(chunk * n, dtype=dtype, device=device)
            self.ref = torch.cat([pattern(r, r * chunk, chunk, dtype, device) for r in range(n)])
        elif op == "reduce_scatter":
            self.inp = pattern(rank, 0, chunk * n, dtype, device)
            self.out = torch.empty(chunk, dtype=dtype, device=device)
            self.ref = sum(pattern(r, rank * chunk, chunk, acc, device) for r in range(n)).to(dtype)
        elif op == "all_to_all":
            self.send = [a2a_split(rank, j, count, n) for j in range(n)]
            self.recv = [a2a_split(i, rank, count, n) for i in range(n)]
            self.inp = pattern(rank, 0, count, dtype, device)
            self.out = torch.empty(sum(self.recv), dtype=dtype, device=device)
            parts = []
            for i in range(n):  # rank i's block for me starts after its blocks for ranks before me
                offset = sum(a2a_split(i, j, count, n) for j in range(rank))
                parts.append(pattern(i, offset, self.recv[i], dtype, device))
            self.ref = torch.cat(parts)
        elif op == "broadcast":
            self.inp = pattern(0, 0, count, dtype, device) if rank == 0 else torch.zeros(count, dtype=dtype,
                                                                                       device=device)
            self.out = self.inp
            self.ref = pattern(0, 0, count, dtype, device)
        elif op == "send_recv":  # a ring: send to the next rank, receive from the previous one
            self.inp = pattern(rank, 0, count, dtype, device)
            self.out = torch.empty_like(self.inp)
            self.ref = pattern((rank - 1) % n, 0, count, dtype, device)
        else:
            raise ValueError(f"unknown collective {op!r}")

    def run(self) -> None:
        import torch.distributed as dist

        inp, out = self.inp, self.out
        if self.op == "all_reduce":
            out.copy_(inp)
            dist.all_reduce(out)
        elif self.op == "all_gather":
            _collective("all_gather_single", "all_gather_into_tensor")(out, inp)
        elif self.op == "reduce_scatter":
            _collective("reduce_scatter_single", "reduce_scatter_tensor")(out, inp)
        elif self.op == "all_to_all":
            dist.all_to_all_single(out, inp, self.recv, self.send)
        elif self.op == "broadcast":
            dist.broadcast(out, src=0)
        else:
            ops = [dist.P2POp(dist.isend, inp, (self.rank + 1) % self.n),
                   dist.P2POp(dist.irecv, out, (self.rank - 1) % self.n)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()

    def mismatch(self) -> str | None:
        """None when the result equals the reference, else where it first differs."""
        import torch

        got, want = self.out.view(torch.uint8), self.ref.view(torch.uint8)
        if got.shape == want.shape and torch.equal(got, want):
            return None
        if self.out.shape != self.ref.shape:
            return f"shape {tuple(self.out.shape)} != {tuple(self.ref.shape)}"
        bad = (self.out != self.ref).nonzero()
        i = int(bad[0]) if bad.numel() else 0
        return (f"{bad.numel()} of {self.out.numel()} elements differ; first at {i}: got "
                f"{self.out[i].item()}, expected {self.ref[i].item()}")


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_rank(settings: CommSettings, sizes: list[int], progress: Any,
                 rank_setup: Callable[[int], None] | None = None) -> list[dict[str, Any]]:
    """One rank (run by ``launch``): every (op, dtype, size) case, its check and its per-iteration seconds.
    ``progress[rank]`` names the case in flight with its start time, for the parent's watchdog;
    ``rank_setup(rank)`` runs first (tests plant faults with it)."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")
    if rank_setup is not None:
        rank_setup(rank)
    sweep = [settings, sizes]  # every node sweeps rank 0's cases (another host may have less memory)
    dist.broadcast_object_list(sweep, src=0)
    settings, sizes = sweep
    rows = []
    for op in settings.ops:
        for name in settings.dtypes:
            dtype, reduces = _wire(_torch_dtype(name))
            if op in REDUCING and not reduces:
                continue
            row: dict[str, Any] = {"op": op, "dtype": name, "sizes": []}
            for size in sizes:
                label = f"{op} {name} at {size} B"
                count = max(size // dtype.itemsize // n * n, n)
                case = _Case(op, dtype, count, rank, n, device)
                try:
                    progress[rank] = (label, time.time())
                    case.run()
                    _sync(device)
                    wrong = case.mismatch()
                    for _ in range(settings.warmup):
                        progress[rank] = (label, time.time())
                        case.run()
                    _sync(device)
                    seconds = []
                    for _ in range(max(3, min(settings.iters, (1 << 30) // size))):
                        progress[rank] = (label, time.time())  # outside the timed span: an IPC round trip
                        t0 = time.perf_counter()
                        case.run()
                        _sync(device)
                        seconds.append(time.perf_counter() - t0)
                except Exception as exc:
                    raise RuntimeError(f"{label} failed on rank {rank}: {type(exc).__name__}: {exc}") from exc
                row["sizes"].append({"bytes": count * dtype.itemsize, "seconds": seconds, "mismatch": wrong})
                del case
            rows.append(row)
    progress[rank] = ("done", time.time())
    return rows


# ---------------------------------------------------------------- the parent


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    at = (len(ordered) - 1) * q
    lo, hi = math.floor(at), math.ceil(at)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (at - lo)


def merge_ranks(per_rank: list[list[dict[str, Any]]], n: int) -> list[dict[str, Any]]:
    """One row per (op, dtype): ok when every rank matched the reference at every size; an iteration lasts as
    long as its slowest rank; algbw/busbw in GB/s (1e9 bytes) from the mean iteration."""
    out = []
    for i, first in enumerate(per_rank[0]):
        sizes, problems = [], []
        for j, point in enumerate(first["sizes"]):
            points = [rows[i]["sizes"][j] for rows in per_rank]
            problems += [f"rank {r} at {point['bytes']} B: {p['mismatch']}" for r, p in enumerate(points)
                         if p["mismatch"]]
            steps = [max(p["seconds"][k] for p in points) for k in range(min(len(p["seconds"]) for p in points))]
            mean = sum(steps) / len(steps)
            algbw = point["bytes"] / mean / 1e9 if mean > 0 else None
            sizes.append({
                "bytes": point["bytes"], "iters": len(steps),
                "algbw_gbps": algbw, "busbw_gbps": None if algbw is None else algbw * bus_factor(first["op"], n),
                "latency_us": {"p50": _percentile(steps, 0.5) * 1e6, "p99": _percentile(steps, 0.99) * 1e6,
                               "max": max(steps) * 1e6},
            })
        row = {"op": first["op"], "dtype": first["dtype"], "ok": not problems, "sizes": sizes}
        if problems:
            row["mismatches"] = problems[:8]
        out.append(row)
    return out


def _stall_watchdog(progress: Any, started: float, bound: float,
                    startup: float = STARTUP_BOUND_S) -> Callable[[], str | None]:
    def check() -> str | None:
        now = time.time()
        cases = dict(progress)
        if not cases and now - started > startup:
            return f"no rank started measuring within {startup:.0f} s (the process group did not form)"
        for rank, (label, since) in sorted(cases.items()):
            if label != "done" and now - since > bound:
                return f"{label} did not finish within {bound:.0f} s on rank {rank}"
        return None

    return check


def measure(ranks: int, settings: CommSettings, rank_setup: Callable[[int], None] | None = None,
            node: Any = None) -> dict[str, Any]:
    """Run the sweep over ``ranks`` processes; the ``comm`` section (``ranks``, ``collectives``). A collective that
    fails or stalls raises ``StageFailed`` naming it. ``node`` (a ``NodeSpec``): ``ranks`` span the nodes and
    this host runs its share; node 0 merges every rank's measurements, another node returns ``{"ranks",
    "node"}`` once its ranks are done."""
    import torch.multiprocessing as mp

    from agents.runtime.distributed import launch

    sizes = settings.sizes()
    if ranks < 2:
        return {"ranks": ranks, "collectives": [], "notes": ["one rank: the layout uses no collectives"]}
    bound = settings.op_timeout_s + settings.watchdog_grace_s
    # across hosts the rendezvous itself may wait for a late node (and names it when it never comes)
    startup = max(STARTUP_BOUND_S, float(node.timeout) + 60) if node is not None else STARTUP_BOUND_S
    with mp.get_context("spawn").Manager() as manager:
        progress = manager.dict()
        try:
            per_rank = launch(measure_rank, ranks, settings, sizes, progress, rank_setup,
                              pg_timeout=settings.op_timeout_s,
                              watchdog=_stall_watchdog(progress, time.time(), bound, startup), node=node)
        except RuntimeError as exc:
            raise StageFailed(f"collectives over {ranks} ranks: {str(exc).splitlines()[0]}") from exc
    if node is not None and node.node_rank != 0:
        return {"ranks": ranks, "node": node.node_rank, "collectives": []}
    collectives = merge_ranks(per_rank, ranks)
    section: dict[str, Any] = {"ranks": ranks, "collectives": collectives, "settings": asdict(settings)}
    bad = [f"{row['op']} {row['dtype']} ({row['mismatches'][0]})" for row in collectives if not row["ok"]]
    if bad:
        section["error"] = f"collectives differ from the reference: {'; '.join(bad[:4])}"
    return section


def ops_for_layout(tp: int, pp: int, ep: int) -> tuple[str, ...]:
    """The collectives a TP × PP × EP layout runs: TP shards reduce and gather partial results (and the engine
    broadcasts each step); EP dispatches tokens to experts (all-to-all, uneven by routing); PP hands activations
    stage to stage."""
    ops: set[str] = set()
    if tp > 1:
        ops |= {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    if ep > 1:
        ops |= {"all_to_all", "all_reduce", "all_gather"}
    if pp > 1:
        ops |= {"send_recv", "broadcast"}
    return tuple(op for op in COLLECTIVES if op in ops)


def _degree(ctx: StageContext, name: str) -> int | None:
    value = getattr(ctx, name, None)
    if value is None:
        value = ((ctx.results.get("plan") or {}).get("plan") or {}).get(name) if str(ctx.device).startswith("cuda") \
            else None
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise StageFailed(f"{name}={value!r} must be a positive integer")
    return value


def _option(ctx: StageContext, key: str, kind: type, default: Any) -> Any:
    value = ctx.bench.get(key, default)
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, kind if kind is not float else int | float):
        raise StageFailed(f"bench option {key}={value!r} must be {'an integer' if kind is int else 'a number'}")
    return value


def _memory_bound(ranks: int, device: str) -> int:
    """The largest message each rank can hold about eight times (input, output, reference, accumulator)."""
    import torch

    if device.startswith("cuda"):
        free = min(torch.cuda.mem_get_info(d)[0] for d in range(min(ranks, torch.cuda.device_count())))
    else:  # the ranks share this host's available memory; leave half of it to everything else
        import os

        free = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") // 2 // ranks
    return max(8, 1 << max(3, int(free // 8).bit_length() - 1))


def settings_for(ctx: StageContext, ops: tuple[str, ...], ranks: int) -> CommSettings:
    """The sweep for this job: ``ctx.bench`` options ``comm_collectives`` (comma list), ``comm_dtypes``,
    ``comm_min_bytes``, ``comm_max_bytes`` (default 256 MiB on CUDA, 4 MiB on CPU; always capped by memory),
    ``comm_factor``, ``comm_iters``, ``comm_warmup``, ``comm_timeout_s``; dtypes default to the hardware's."""
    hw_dtypes = [d for d in (ctx.hardware.get("dtypes") or [ctx.dtype]) if isinstance(d, str)]
    ops = ctx.bench.get("comm_collectives") or ops
    dtypes = ctx.bench.get("comm_dtypes") or hw_dtypes
    ops, dtypes = (tuple(v.split(",")) if isinstance(v, str) else tuple(v) for v in (ops, dtypes))
    unknown = [d for d in dtypes if not isinstance(d, str) or _torch_dtype(d) is None and d != "tfloat32"]
    if unknown:
        raise StageFailed(f"comm dtype(s) {unknown} are no torch dtype")
    dtypes = tuple(d for d in dtypes if d != "tfloat32")  # a matmul mode: its storage is float32
    cap = DEFAULT_MAX_BYTES if str(ctx.device).startswith("cuda") else DEFAULT_CPU_MAX_BYTES
    max_bytes = min(_option(ctx, "comm_max_bytes", int, cap), _memory_bound(ranks, ctx.device))
    try:
        return CommSettings(ops=ops, dtypes=dtypes, min_bytes=min(_option(ctx, "comm_min_bytes", int, 1024), max_bytes),
                            max_bytes=max_bytes, factor=_option(ctx, "comm_factor", int, 4),
                            iters=_option(ctx, "comm_iters", int, 20), warmup=_option(ctx, "comm_warmup", int, 3),
                            op_timeout_s=float(_option(ctx, "comm_timeout_s", float, 60.0)))
    except ValueError as exc:
        raise StageFailed(str(exc)) from exc


def run(ctx: StageContext) -> dict[str, Any]:
    """The comm section over the job's ranks: ``pp × max(tp, ep)`` (the planner's device count), the pinned
    degrees on CPU, the plan's on CUDA clipped to this host's devices; ``comm_ranks`` overrides the count."""
    import torch

    tp, pp, ep = (_degree(ctx, name) or 1 for name in ("tp", "pp", "ep"))
    ranks = pp * max(tp, ep)
    pinned = ctx.bench.get("comm_ranks")
    if pinned is not None:
        ranks = _option(ctx, "comm_ranks", int, 1)
        if not 1 <= ranks <= MAX_RANKS:
            raise StageFailed(f"comm_ranks={ranks} must be from 1 to {MAX_RANKS}")
    # ranks pinned for a one-device layout (the hardware's own check): every collective
    ops = ops_for_layout(tp, pp, ep) if (tp, pp, ep) != (1, 1, 1) else COLLECTIVES
    cuda = str(ctx.device).startswith("cuda")
    node = stage_node(ctx, "comm")
    limit = (torch.cuda.device_count() if cuda else MAX_CPU_RANKS) * (node.nnodes if node is not None else 1)
    notes = []
    if ranks > limit:
        if pinned is not None or (ctx.tp or 1) * (getattr(ctx, "pp", None) or 1) > limit:
            raise StageFailed(f"{ranks} ranks asked; this host runs {limit} "
                              f"{'CUDA devices' if cuda else 'CPU processes'}")
        notes.append(f"the plan's {ranks} ranks clipped to the {limit} devices of this host")
        ranks = limit
    settings = settings_for(ctx, ops, ranks)
    ctx.emit("log", f"collectives {', '.join(settings.ops) or '-'} over {ranks} ranks "
                    f"({'NCCL' if cuda else 'gloo'}), dtypes {', '.join(settings.dtypes)}, "
                    f"{settings.min_bytes}-{settings.max_bytes} B")
    if node is not None and ctx.state.server is not None:  # its last users (bench, eval, soak) ran before comm
        stop_server(ctx)  # the other nodes' serve ranks end with it and join this stage's rendezvous
    section = measure(ranks, settings, node=node)
    section["layout"] = {"tp": tp, "pp": pp, "ep": ep}
    if node is not None:
        section["nnodes"] = node.nnodes
    section["backend"] = "nccl" if cuda else "gloo"
    skipped = [f"{op} in {d}" for op in settings.ops if op in REDUCING for d in settings.dtypes
               if not _wire(_torch_dtype(d))[1]]
    if skipped:
        notes.append(f"no reduction in 8-bit or packed dtypes (the backends do not reduce them): {', '.join(skipped)}")
    section["notes"] = section.get("notes", []) + notes
    return section


def _collective(*names: str) -> Callable[..., Any]:
    """The first of torch.distributed's names for a collective that this torch has (2.13 names the tensor
    forms ``*_single`` and warns on the old names)."""
    import torch.distributed as dist

    return next(getattr(dist, n) for n in names if hasattr(dist, n))
