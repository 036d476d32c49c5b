"""The ``comm`` stage: the collectives of the job's layout over its ranks (``support.collectives``), for every
dtype the hardware lists; the sweep's bounds from the job's ``bench`` options, capped by this host's memory."""

from __future__ import annotations

from typing import Any

from agents.pipeline.support.collective_rank import (
    COLLECTIVES,
    DEFAULT_MAX_BYTES,
    MIB,
    REDUCING,
    CommSettings,
    torch_dtype,
    wire_dtype,
)
from agents.pipeline.support.collectives import measure, ops_for_layout
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.nodes import stage_node
from agents.pipeline.support.server import stop_server

# CPU ranks share the host's cores (gloo over loopback): the sweep there proves conformance and shows latency;
# a job may raise it with comm_max_bytes
DEFAULT_CPU_MAX_BYTES = 4 * MIB
MAX_RANKS = 64
# CPU ranks are processes sharing this host's cores: enough to prove conformance, not to measure a fabric
MAX_CPU_RANKS = 8


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
    unknown = [d for d in dtypes if not isinstance(d, str) or torch_dtype(d) is None and d != "tfloat32"]
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
               if not wire_dtype(torch_dtype(d))[1]]
    if skipped:
        notes.append(f"no reduction in 8-bit or packed dtypes (the backends do not reduce them): {', '.join(skipped)}")
    section["notes"] = section.get("notes", []) + notes
    return section
