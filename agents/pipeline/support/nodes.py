"""Ranks across hosts (``day0 adapt --nnodes N --node-rank R --master-addr A --master-port P``): each stage
that runs ranks (load, serve, comm) meets the other nodes at its own port (``master_port + STAGE_PORTS[stage]``),
so one stage's rendezvous never meets another's. ``agents.pipeline.follower`` runs a non-zero node's share."""

from __future__ import annotations

from typing import Any

from agents.pipeline.support.context import StageContext
from agents.runtime.commands.serve import serve_command as runtime_serve_command

STAGE_PORTS = {"load": 0, "serve": 1, "comm": 2}
RANKED_STAGES = tuple(STAGE_PORTS)


def stage_node(ctx: StageContext, stage: str) -> Any:
    """The ``NodeSpec`` the ranks of ``stage`` meet with, or None on one host."""
    node = getattr(ctx, "node", None)
    if node is None or not node.multi:
        return None
    return node.with_port(STAGE_PORTS[stage])


def serve_command(ctx: StageContext, tp: int, ep: int, pp: int) -> list[str]:
    """``day0 serve`` for this node's ranks of the serve stage (node 0 adds its HTTP port)."""
    node = stage_node(ctx, "serve")
    layout = [a for name, v in (("--tp", tp), ("--ep", ep), ("--pp", pp)) if v > 1 for a in (name, str(v))]
    return runtime_serve_command(ctx.model_dir, dtype=ctx.dtype, device=ctx.device,
                                 args=[*layout, *node.as_args(), *ctx.bench.get("serve_args", [])])
