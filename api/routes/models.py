"""`GET /v1/models`: each model with a live worker, and the tool-call parser its replies are
read with (`api.jobs.tool_parser`)."""

from __future__ import annotations

import time

from fastapi import APIRouter

from tokenrelay.api.deps import CallerDep, StateDep
from tokenrelay.api.error_docs import AUTH_ERRORS, MODEL_ERRORS
from tokenrelay.api.jobs.model_routing import served_models
from tokenrelay.api.jobs.tool_parser import parser_name
from tokenrelay.api.openai.schema import ModelCard, ModelList
from tokenrelay.api.state import AppState
from tokenrelay.shared.errors import ModelNotFound

router = APIRouter(prefix="/v1", tags=["models"], responses=AUTH_ERRORS)

_STARTED = int(time.time())


@router.get("/models")
async def list_models(state: StateDep, _: CallerDep) -> ModelList:
    """Models with at least one live worker."""
    live, _known = await served_models(state)
    return ModelList(data=[await _card(state, model) for model in sorted(live)])


@router.get("/models/{model_id:path}", responses=MODEL_ERRORS)
async def retrieve_model(model_id: str, state: StateDep, _: CallerDep) -> ModelCard:
    """One model with a live worker; 404 `model_not_found` for any other."""
    live, _known = await served_models(state)
    if model_id not in live:
        raise ModelNotFound(
            f"model {model_id!r} is not served here; GET /v1/models lists {sorted(live)}",
            param="model",
        )
    return await _card(state, model_id)


async def _card(state: AppState, model: str) -> ModelCard:
    return ModelCard(id=model, created=_STARTED, tool_call_parser=await parser_name(state, model))
