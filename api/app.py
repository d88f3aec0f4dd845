"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from api import errors
from api.reaper import reap_forever
from api.routes import chat, health, jobs, models
from api.state import AppState
from shared.settings import Settings


def create_app(settings: Settings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = AppState.build(settings)
        app.state.tokenrelay = state
        state.hub.start()
        reaper = asyncio.create_task(reap_forever(state), name="lease-reaper")
        try:
            yield
        finally:
            reaper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reaper
            await state.close()

    app = FastAPI(
        title="tokenrelay",
        summary="OpenAI-compatible LLM gateway: global admission, queueing, streaming.",
        version="0.1.0",
        lifespan=lifespan,
    )
    errors.install(app)
    for router in (chat.router, jobs.router, models.router, health.router):
        app.include_router(router)
    return app


def create_app_from_env() -> FastAPI:
    """Entry point for uvicorn (`factory=True`): settings from `TOKENRELAY_*`."""
    return create_app(Settings())
