"""The stages the runner knows, by the name the report and the job's ``stages`` use: one ``run(ctx) -> section``
each (docs/stage-report.md). The order they run in is ``tiers.STAGE_ORDER``; every name there has an entry here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from agents.pipeline.stages import bench, comm, env, load, plan, reference, serve, soak
from agents.pipeline.stages.align import endpoint as endpoint_align
from agents.pipeline.stages.align import stage as align
from agents.pipeline.stages.conformance import stage as conformance
from agents.pipeline.stages.eval import stage as evaluation
from agents.pipeline.stages.inventory import stage as inventory
from agents.pipeline.support.context import StageContext
from contract.engines import INTERNAL_STAGES, is_external

Stage = Callable[[StageContext], dict[str, Any]]


def internals(name: str, run: Stage, external: Stage | None = None) -> Stage:
    """``run``, except for a job on an external engine (``contract.engines``): there ``external`` (align: endpoint
    align), else the stage reads the bundled runtime's internals, is not applicable, and its section says so and
    what replaces it."""

    def stage(ctx: StageContext) -> dict[str, Any]:
        if not is_external(ctx.engine):
            return run(ctx)
        if external is not None:
            return external(ctx)
        return {"applicable": False, "engine": (ctx.engine or {}).get("name"), "reason": INTERNAL_STAGES[name],
                "replaced_by": ["align", "serve", "eval"]}

    stage.__doc__ = run.__doc__
    return stage


STAGES: dict[str, Stage] = {
    "plan": plan.run,
    "load": load.run,
    "inventory": internals("inventory", inventory.run),
    "align": internals("align", align.run, endpoint_align.run),
    "serve": serve.run,
    "conformance": conformance.run,
    "bench": bench.run,
    "eval": evaluation.run,
    "soak": soak.run,
    "comm": comm.run,
    "env": env.run,
    "reference": reference.run,
}
