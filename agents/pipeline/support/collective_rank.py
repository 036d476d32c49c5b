"""What the collectives sweep measures (``CommSettings``) and one rank of it (``measure_rank``, run by
``agents.runtime.distributed.launch`` in each rank's process): every (op, dtype, size) case with its buffers,
the collective itself, the check against the reference the rank computes locally and the per-iteration seconds.

Inputs are small integers (exact in every float dtype, so a sum is the same in any order), laid out per rank and
element so that a value in the wrong place or from the wrong rank is caught."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")
REDUCING = frozenset({"all_reduce", "reduce_scatter"})
MIB = 1 << 20
DEFAULT_MAX_BYTES = 256 * MIB


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


def torch_dtype(name: str) -> Any:
    """(storage dtype, whether reductions run in it) of a hardware dtype name; None when it is no storage
    dtype (tfloat32 is a matmul mode over float32 storage)."""
    import torch

    dtype = getattr(torch, name, None)
    if name.startswith("float4") and dtype is None:
        dtype = getattr(torch, name + "_x2", None)
    return dtype if isinstance(dtype, torch.dtype) else None


def wire_dtype(dtype: Any) -> tuple[Any, bool]:
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
            collective_named("all_gather_single", "all_gather_into_tensor")(out, inp)
        elif self.op == "reduce_scatter":
            collective_named("reduce_scatter_single", "reduce_scatter_tensor")(out, inp)
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
            dtype, reduces = wire_dtype(torch_dtype(name))
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


def collective_named(*names: str) -> Callable[..., Any]:
    """The first of torch.distributed's names for a collective that this torch has (2.13 names the tensor
    forms ``*_single`` and warns on the old names)."""
    import torch.distributed as dist

    return next(getattr(dist, n) for n in names if hasattr(dist, n))
