"""A job over several hosts (``day0 adapt --nnodes N --node-rank R --master-addr A --master-port P``).

Node 0 runs the pipeline and writes the report. Each stage that runs ranks (load, serve, comm) runs this node's
share of them and meets the other nodes at its own port (``master_port + STAGE_PORTS[stage]``), so one stage's
rendezvous never meets another's. Every other node *follows*: it runs the plan stage (cheap, deterministic: the
same layout as node 0) and then, in pipeline order, its ranks of each requested ranked stage — the serve stage's
worker ranks last until node 0's server stops (after bench, eval and soak). A follower's ranks report to node 0
through the collectives; the follower itself emits its stage events (an agent posts them to the job's log)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from agents.pipeline.registry import STAGES
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.layout import effective_layout, effective_tp
from agents.pipeline.support.nodes import RANKED_STAGES, serve_command, stage_node
from agents.pipeline.support.server_process import REPO_ROOT
from agents.pipeline.support.sharded_load import LOAD_TIMEOUT_S, load_rank, quant_args


def follow(ctx: StageContext, stages: list[str]) -> dict[str, Any]:
    """Run this (non-zero) node's ranks of every ranked stage in ``stages``; ``{"node", "stages": {stage:
    {"ok", "seconds", "error"?}}, "failed_stage"}``. Stops at the first stage whose ranks failed."""
    node = ctx.node
    out: dict[str, Any] = {"node": node.node_rank, "nnodes": node.nnodes, "stages": {}, "failed_stage": None}
    if "plan" in stages:
        ctx.results["plan"] = STAGES["plan"](ctx)
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
    from agents.runtime.distributed import launch

    tp = effective_tp(ctx)[0]
    _, ep, pp = effective_layout(ctx)
    reports = launch(load_rank, pp * max(tp, ep), str(ctx.model_dir), ctx.dtype, ctx.device, ctx.manifest,
                     bool(ctx.thresholds.get("fail_on_nonfinite", 0)), None, quant_args(ctx), tp_size=tp, ep_size=ep, pp_size=pp,
                     timeout=LOAD_TIMEOUT_S, node=stage_node(ctx, "load"))
    failed = [r for r in reports if "error" in r]
    if failed:
        raise StageFailed(f"rank {failed[0]['rank']}: {failed[0]['error']}")


def _follow_serve(ctx: StageContext) -> None:
    tp, ep, pp = effective_layout(ctx)
    log_path = Path(ctx.workdir) / f"serve-node{ctx.node.node_rank}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("w") as log:
        proc = subprocess.Popen(serve_command(ctx, tp, ep, pp), stdout=log, stderr=subprocess.STDOUT,
                                cwd=REPO_ROOT)
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
    STAGES["comm"](ctx)  # this node's ranks of the sweep; node 0 merges them


_FOLLOWERS = {"load": _follow_load, "serve": _follow_serve, "comm": _follow_comm}
