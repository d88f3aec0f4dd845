"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from api import errors
from api.body_limit import BodySizeLimit
from api.metrics import Metrics
from api.reaper import reap_forever
from api.request_log import RequestLog
from api.routes import article_clients, chat, cluster, completions, console, health, jobs, models
from api.routes import metrics as metrics_route
from api.state import AppState
from api.webhooks import dispatch_webhooks
from shared.settings import Settings


def create_app(settings: Settings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = AppState.build(settings)
        app.state.tokenrelay = state
        state.hub.start()
        reaper = asyncio.create_task(reap_forever(state), name="lease-reaper")
        webhooks = asyncio.create_task(dispatch_webhooks(state), name="webhook-dispatcher")
        try:
            yield
        finally:
            for task in (reaper, webhooks):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await state.close()

    app = FastAPI(
        title="tokenrelay",
        summary="OpenAI-compatible LLM gateway: global admission, queueing, streaming.",
        version="0.1.0",
        lifespan=lifespan,
    )
    errors.install(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_request_bytes)
    metrics = Metrics.from_environment()
    app.state.metrics = metrics
    app.add_middleware(RequestLog, metrics=metrics, log_prompts=settings.log_prompts)
    for router in (
        chat.router,
        completions.router,
        article_clients.router,
        jobs.router,
        models.router,
        health.router,
        cluster.router,
        console.router,
        metrics_route.router,
    ):
        app.include_router(router)
    return app


def create_app_from_env() -> FastAPI:
    """Entry point for uvicorn (`factory=True`): settings from `TOKENRELAY_*`."""
    return create_app(Settings())
