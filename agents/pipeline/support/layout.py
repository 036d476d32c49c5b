"""The layout a job runs with on this host: the tensor-parallel degree (the job's pin, else the plan's clipped to
this host's devices) and the expert and pipeline degrees (the job's pins), checked against the ranks this host
(or each of the job's nodes) can run."""

from __future__ import annotations

from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed

# CPU ranks are processes sharing this host's cores and memory: enough to prove TP, not to serve with it
MAX_CPU_TP = 8


def effective_tp(ctx: StageContext) -> tuple[int, str | None]:
    """(TP degree to run with, a note when the plan's degree was changed).

    ``ctx.tp`` (a job's override, ``day0 adapt --tp``) wins; else the plan section's ``plan.tp``, clipped to the
    CUDA devices of this host. On CPU the plan's degree is not used (ranks would only share the same cores):
    TP stays 1 unless asked, and an override may ask for up to ``MAX_CPU_TP`` processes."""
    plan = ((ctx.results.get("plan") or {}).get("plan") or {}).get("tp")
    cuda = str(ctx.device).startswith("cuda")
    devices = _cuda_devices() if cuda else MAX_CPU_TP
    if ctx.tp is not None:
        if isinstance(ctx.tp, bool) or not isinstance(ctx.tp, int) or ctx.tp < 1:
            raise StageFailed(f"tp={ctx.tp!r} must be a positive integer")
        if ctx.tp > devices:
            where = f"{devices} CUDA device(s) on this host" if cuda else f"at most {MAX_CPU_TP} CPU processes"
            raise StageFailed(f"tp={ctx.tp} asks for more ranks than this host runs ({where})")
        return ctx.tp, None
    if not plan or plan <= 1:
        return 1, None
    if not cuda:
        return 1, f"the plan's tp={plan} is for the target hardware; on {ctx.device} this run uses tp=1 (pin --tp to shard)"
    if plan > devices:
        return max(devices, 1), f"the plan's tp={plan} clipped to the {devices} CUDA device(s) of this host"
    return int(plan), None


def effective_layout(ctx: StageContext) -> tuple[int, int, int]:
    """(tp, ep, pp) to run with: tp as ``effective_tp``; ep and pp the job's pins (else 1). The ranks are
    ``pp × max(tp, ep)``, at most this host's devices (or ``MAX_CPU_TP`` CPU processes)."""
    tp = effective_tp(ctx)[0]
    degrees = []
    for name in ("ep", "pp"):
        value = getattr(ctx, name, None)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise StageFailed(f"{name}={value!r} must be a positive integer")
        degrees.append(value or 1)
    ep, pp = degrees
    world, cuda = pp * max(tp, ep), str(ctx.device).startswith("cuda")
    devices = _cuda_devices() if cuda else MAX_CPU_TP
    nnodes = getattr(ctx.node, "nnodes", 1)
    if world > devices * nnodes:
        where = f"{devices} CUDA device(s) on this host" if cuda else f"at most {MAX_CPU_TP} CPU processes"
        where += f", on each of {nnodes} nodes" if nnodes > 1 else ""
        raise StageFailed(f"tp={tp}, ep={ep}, pp={pp} need {world} ranks; this host runs {where}")
    return tp, ep, pp


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
