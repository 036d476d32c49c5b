"""``/v1/models`` and ``/v1/models/{id}``: the served model's card."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from agents.runtime.server.errors import APIError
from agents.runtime.server.handlers.common import ServerState


def model_card(state: ServerState) -> dict[str, Any]:
    engine = state.engine_if_ready()
    return {
        "id": state.model_name,
        "object": "model",
        "created": int(state.started),
        "owned_by": "day0",
        "max_model_len": engine.max_model_len if engine else None,
        "vocab_size": engine.vocab_size if engine else None,
        **({"modalities": ["text", "image"], "image_token_id": engine.model.image_token_id}
           if engine and getattr(engine.model, "takes_images", False) else {}),
    }


async def models(state: ServerState, request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [model_card(state)]})


async def model(state: ServerState, request: Request) -> Response:
    wanted = request.path_params["model_id"]
    if wanted != state.model_name:
        raise APIError(404, f"The model '{wanted[:200]}' does not exist; this server serves '{state.model_name}'",
                       "model", code="model_not_found")
    return JSONResponse(model_card(state))
