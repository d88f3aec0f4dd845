"""`GET /v1/models`."""

from __future__ import annotations

import time

from fastapi import APIRouter

from tokenrelay.api.deps import CallerDep, StateDep
from tokenrelay.api.error_docs import AUTH_ERRORS
from tokenrelay.api.model_routing import served_models
from tokenrelay.api.openai_schema import ModelCard, ModelList

router = APIRouter(prefix="/v1", tags=["models"], responses=AUTH_ERRORS)

_STARTED = int(time.time())


@router.get("/models")
async def list_models(state: StateDep, _: CallerDep) -> ModelList:
    """Models with at least one live worker."""
    live, _known = await served_models(state)
    return ModelList(data=[ModelCard(id=model, created=_STARTED) for model in sorted(live)])
