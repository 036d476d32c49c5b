"""The job's ``day0 serve`` (``ServerProcess``) as the stages share it: started with the job's layout (this
node's share of the ranks across hosts, ``--compile`` when asked and possible), kept in ``ctx.state.server`` for
the next stage that queries it, stopped by the last one."""

from __future__ import annotations

from pathlib import Path

from agents.pipeline.support.compiled import serve_args
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.layout import effective_layout, effective_tp
from agents.pipeline.support.nodes import stage_node
from agents.pipeline.support.server_process import ServerProcess


def start_server(ctx: StageContext) -> ServerProcess:
    """Start the job's server (not yet ready) and keep it in ``ctx.state.server``."""
    if ctx.model_dir is None:
        raise StageFailed("serve needs the model's weights, but this job has no model directory")
    extra = [str(a) for a in ctx.bench.get("serve_args", [])] + serve_args(ctx)  # bench.compile
    tp, _ = effective_tp(ctx)
    _, ep, pp = effective_layout(ctx)
    layout = tuple(a for name, v in (("--ep", ep), ("--pp", pp)) if v > 1 for a in (name, str(v)))
    node = stage_node(ctx, "serve")  # ranks across hosts: this node's share, node 0 serving HTTP
    layout += tuple(node.as_args()) if node is not None else ()
    server = ServerProcess(
        Path(ctx.model_dir),
        dtype=ctx.dtype,
        device=ctx.device,
        tp=tp if tp > 1 else None,
        log_path=Path(ctx.workdir) / "serve.log",
        extra_args=extra,
        layout_args=layout,
    )
    ctx.state.server = server
    return server


def stop_server(ctx: StageContext) -> None:
    """Stop the server this pipeline started (safe to call twice)."""
    server, ctx.state.server = ctx.state.server, None
    if server is not None:
        server.stop()


def running_server(ctx: StageContext) -> ServerProcess:
    """The server an earlier stage left up, else one started now and ready (a failure to start stops it)."""
    server = ctx.state.server
    if server is not None:
        return server
    server = start_server(ctx)
    try:
        server.wait_ready(float(ctx.bench.get("ready_timeout", 900)), ctx)
    except BaseException:
        stop_server(ctx)
        raise
    return server
