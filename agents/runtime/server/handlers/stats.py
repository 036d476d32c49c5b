"""``/stats/*``: the routed experts' load, the time in collectives, the compiled path's evidence, device memory."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agents.runtime.server.errors import APIError
from agents.runtime.server.fields import parse_json
from agents.runtime.server.handlers.common import ServerState
from agents.runtime.server.middleware import read_body_limited


async def expert_load(state: ServerState, request: Request) -> Response:
    engine = state.engine_if_ready()
    if engine is None or not engine.expert_load.active:
        return APIError(404, "this model has no routed experts (or is still loading)").response()
    return JSONResponse({"counts": engine.expert_load.counts(), "ep_size": engine.expert_load.ep_size})


async def comm_timer(state: ServerState, request: Request) -> Response:
    """GET: this rank's time in collectives and in steps so far; POST ``{"enabled": bool}``: start timing
    from zero, or stop (answering the totals). Timing synchronises the device per collective: only on ask."""
    from agents.runtime.distributed import COMM_TIMER

    if request.method == "POST":
        body = parse_json(await read_body_limited(request, 4096))
        enabled = body.get("enabled") if isinstance(body, dict) else None
        if not isinstance(enabled, bool):
            raise APIError(400, "'enabled' must be true or false", "enabled")
        totals = COMM_TIMER.snapshot()
        COMM_TIMER.enable(enabled)
        return JSONResponse(totals if not enabled else COMM_TIMER.snapshot())
    return JSONResponse(COMM_TIMER.snapshot())


async def compile_stats(state: ServerState, request: Request) -> Response:
    """The compiled path's evidence (``engine/compiled/``): compile seconds, graphs, graph breaks,
    recompiles, compilation-cache hits and misses; ``{"enabled": false}`` when the server runs eager."""
    engine = state.engine_if_ready()
    if engine is None:
        return APIError(503, "the engine is still loading (or failed to start): see /ready").response()
    compiled = getattr(engine, "compiled", None)
    if compiled is None:
        return JSONResponse({"enabled": False, "reason": "this server runs eager (day0 serve --compile)"})
    return JSONResponse(compiled.stats.report())


async def memory_stats(state: ServerState, request: Request) -> Response:
    """This server's device memory: torch's CUDA allocator (allocated now and at most, reserved); on CPU
    there is no device memory apart from the process's resident memory, and the answer says so."""
    engine = state.engine_if_ready()
    device = engine.device if engine is not None else None
    if device is not None and device.type == "cuda":
        import torch

        return JSONResponse({"device": str(device), "source": "torch.cuda",
                             "allocated_bytes": int(torch.cuda.memory_allocated(device)),
                             "max_allocated_bytes": int(torch.cuda.max_memory_allocated(device)),
                             "reserved_bytes": int(torch.cuda.memory_reserved(device))})
    import resource

    with open("/proc/self/statm") as statm:
        rss = int(statm.read().split()[1]) * resource.getpagesize()
    return JSONResponse({"device": str(device) if device is not None else None, "source": "cpu: process RSS",
                         "rss_bytes": rss})
