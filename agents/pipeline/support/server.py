"""The job's ``day0 serve`` (``ServerProcess``) as the stages share it: started with the job's layout (this
node's share of the ranks across hosts, ``--compile`` when asked and possible), kept in ``ctx.state.server`` for
the next stage that queries it, stopped by the last one."""

from __future__ import annotations

import shlex
from pathlib import Path

from agents.pipeline.support.compiled import serve_args
from agents.pipeline.support.context import StageContext
from agents.pipeline.support.engine_process import EngineProcess
from agents.pipeline.support.errors import StageFailed
from agents.pipeline.support.layout import effective_layout, effective_tp
from agents.pipeline.support.nodes import stage_node
from agents.pipeline.support.server_process import ServerProcess
from contract.engines import is_external

ENGINE_MAX_MODEL_LEN = 4096  # an external engine's context unless the job sets bench.max_model_len


def engine_max_model_len(ctx: StageContext) -> int:
    """``{max_model_len}`` of an external engine's command: the job's ``bench.max_model_len``, else the model's
    context up to ``ENGINE_MAX_MODEL_LEN`` (an engine sizes its KV cache for it)."""
    asked = ctx.bench.get("max_model_len")
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        return asked
    config = ctx.config or {}
    context = config.get("max_position_embeddings") or (config.get("text_config") or {}).get("max_position_embeddings")
    return min(int(context), ENGINE_MAX_MODEL_LEN) if isinstance(context, int) and context > 0 else ENGINE_MAX_MODEL_LEN


def served_model(ctx: StageContext) -> str | None:
    """The model id an external engine serves (its requests name it; vLLM wants it), None for the bundled one."""
    server = ctx.state.server
    return server.served_model() if isinstance(server, EngineProcess) else None


def start_server(ctx: StageContext) -> ServerProcess | EngineProcess:
    """Start the job's server (not yet ready) and keep it in ``ctx.state.server``."""
    if ctx.model_dir is None:
        raise StageFailed("serve needs the model's weights, but this job has no model directory")
    if is_external(ctx.engine):  # the job's engine, started by its command, queried through its endpoint
        tp, _ = effective_tp(ctx)
        _, ep, pp = effective_layout(ctx)
        engine = EngineProcess(dict(ctx.engine), Path(ctx.model_dir), dtype=ctx.dtype, tp=tp, pp=pp, ep=ep,
                               log_path=Path(ctx.workdir) / "engine.log", max_model_len=engine_max_model_len(ctx),
                               extra=shlex.join(str(a) for a in ctx.bench.get("serve_args", [])))  # quoted
        ctx.state.server = engine
        return engine
    extra = [str(a) for a in ctx.bench.get("serve_args", [])] + serve_args(ctx)  # bench.compile
    ran = ((ctx.results.get("load") or {}).get("quant") or {}).get("mode")
    if ran in ("native", "emulated"):  # serve a quantised release the way the load stage ran it
        extra += ["--quant-mode", ran]
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


def running_server(ctx: StageContext) -> ServerProcess | EngineProcess:
    """The server an earlier stage left up, else one started now and ready (a failure to start stops it)."""
    server = ctx.state.server
    if server is not None:
        if isinstance(server, EngineProcess):
            server.check_alive()  # an engine that exited mid-job fails the stage that needs it, naming it
        return server
    server = start_server(ctx)
    try:
        server.wait_ready(float(ctx.bench.get("ready_timeout", 900)), ctx)
    except BaseException:
        stop_server(ctx)
        raise
    return server


def stop_engine(ctx: StageContext) -> None:
    """Stop an external engine this pipeline started, with every process of its group (the runner calls it when
    the pipeline ends, however it ends: no process of the job outlives it)."""
    if isinstance(ctx.state.server, EngineProcess):
        stop_server(ctx)
