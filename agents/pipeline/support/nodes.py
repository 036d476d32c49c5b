"""A job over several hosts (``day0 adapt --nnodes N --node-rank R --master-addr A --master-port P``).

Node 0 runs the pipeline and writes the report. Each stage that runs ranks (load, serve, comm) runs this node's
share of them and meets the other nodes at its own port (``master_port + STAGE_PORTS[stage]``), so one stage's
rendezvous never meets another's. Every other node *follows*: it runs the plan stage (cheap, deterministic: the
same layout as node 0) and then, in pipeline order, its ranks of each requested ranked stage — the serve stage's
worker ranks last until node 0's server stops (after bench, eval and soak). A follower's ranks report to node 0
through the collectives; the follower itself emits its stage events (an agent posts them to the job's log)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from agents.pipeline.support.context import StageContext, StageFailed
from agents.runtime.commands.serve import serve_command as runtime_serve_command

STAGE_PORTS = {"load": 0, "serve": 1, "comm": 2}
RANKED_STAGES = tuple(STAGE_PORTS)


def stage_node(ctx: StageContext, stage: str) -> Any:
    """The ``NodeSpec`` the ranks of ``stage`` meet with, or None on one host."""
    node = getattr(ctx, "node", None)
    if node is None or not node.multi:
        return None
    return node.with_port(STAGE_PORTS[stage])


def follow(ctx: StageContext, stages: list[str]) -> dict[str, Any]:
    """Run this (non-zero) node's ranks of every ranked stage in ``stages``; ``{"node", "stages": {stage:
    {"ok", "seconds", "error"?}}, "failed_stage"}``. Stops at the first stage whose ranks failed."""
    import time

    from agents.pipeline.stages import plan

    node = ctx.node
    out: dict[str, Any] = {"node": node.node_rank, "nnodes": node.nnodes, "stages": {}, "failed_stage": None}
    if "plan" in stages:
        ctx.results["plan"] = plan.run(ctx)
    for stage in (s for s in stages if s in RANKED_STAGES):
        ctx.current_stage = stage
        ctx.emit("stage_started", f"{stage}: node {node.node_rank} of {node.nnodes} runs its ranks",
                 data={"stage": stage, "node": node.node_rank})
        t0 = time.perf_counter()
        error = None
        try:
            ctx.check_cancelled()
            _FOLLOWERS[stage](ctx)
        except StageFailed as exc:
            error = str(exc)
        except RuntimeError as exc:  # a rank failed or a rendezvous timed out: its first line says which
            error = str(exc).splitlines()[0]
        seconds = round(time.perf_counter() - t0, 3)
        out["stages"][stage] = {"ok": error is None, "seconds": seconds, **({"error": error} if error else {})}
        ctx.emit("stage_finished", f"{stage} ranks of node {node.node_rank} " +
                 ("ended" if error is None else f"failed: {error}"), level="info" if error is None else "error",
                 data={"stage": stage, "node": node.node_rank, "passed": error is None, "seconds": seconds,
                       "error": error})
        if error is not None:
            out["failed_stage"], out["error"] = stage, error
            break
    ctx.current_stage = ""
    return out


def _follow_load(ctx: StageContext) -> None:
    from agents.pipeline.support.sharded_load import LOAD_TIMEOUT_S, effective_layout, effective_tp, load_rank
    from agents.runtime.distributed import launch

    tp = effective_tp(ctx)[0]
    _, ep, pp = effective_layout(ctx)
    reports = launch(load_rank, pp * max(tp, ep), str(ctx.model_dir), ctx.dtype, ctx.device, ctx.manifest,
                     bool(ctx.thresholds.get("fail_on_nonfinite", 0)), None, tp_size=tp, ep_size=ep, pp_size=pp,
                     timeout=LOAD_TIMEOUT_S, node=stage_node(ctx, "load"))
    failed = [r for r in reports if "error" in r]
    if failed:
        raise StageFailed(f"rank {failed[0]['rank']}: {failed[0]['error']}")


def serve_command(ctx: StageContext, tp: int, ep: int, pp: int) -> list[str]:
    """``day0 serve`` for this node's ranks of the serve stage (node 0 adds its HTTP port)."""
    node = stage_node(ctx, "serve")
    layout = [a for name, v in (("--tp", tp), ("--ep", ep), ("--pp", pp)) if v > 1 for a in (name, str(v))]
    return runtime_serve_command(ctx.model_dir, dtype=ctx.dtype, device=ctx.device,
                                 args=[*layout, *node.as_args(), *ctx.bench.get("serve_args", [])])


def _follow_serve(ctx: StageContext) -> None:
    from agents.pipeline.support.sharded_load import effective_layout

    tp, ep, pp = effective_layout(ctx)
    log_path = Path(ctx.workdir) / f"serve-node{ctx.node.node_rank}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(serve_command(ctx, tp, ep, pp), stdout=log, stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parents[3])
        try:
            while proc.poll() is None:  # until node 0's server stops (its rank 0 releases our ranks)
                if ctx.cancel_event.wait(0.5):
                    proc.terminate()
                    proc.wait(timeout=30)
                    ctx.check_cancelled()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    if proc.returncode:
        tail = log_path.read_text(errors="replace").strip().splitlines()[-1:]
        raise StageFailed(f"worker ranks exited with code {proc.returncode}: {tail[0] if tail else ''}")


def _follow_comm(ctx: StageContext) -> None:
    from agents.pipeline.stages import comm

    comm.run(ctx)


_FOLLOWERS = {"load": _follow_load, "serve": _follow_serve, "comm": _follow_comm}
