"""`GET /v1/models`."""

from __future__ import annotations

import time

from fastapi import APIRouter

from api.deps import CallerDep, SettingsDep
from api.openai_schema import ModelCard, ModelList

router = APIRouter(prefix="/v1", tags=["models"])

_STARTED = int(time.time())


@router.get("/models")
async def list_models(settings: SettingsDep, _: CallerDep) -> ModelList:
    return ModelList(data=[ModelCard(id=settings.model_id, created=_STARTED)])
