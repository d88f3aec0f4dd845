"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from tokenrelay.api import background, errors, gc_tuning
from tokenrelay.api.batch_feeder import BatchFeeder
from tokenrelay.api.body_limit import BodySizeLimit
from tokenrelay.api.metrics import Metrics
from tokenrelay.api.reaper import reap_forever
from tokenrelay.api.request_id import RequestId
from tokenrelay.api.request_log import RequestLog
from tokenrelay.api.routes import (
    article_clients,
    batches,
    chat,
    cluster,
    completions,
    console,
    files,
    health,
    jobs,
    models,
)
from tokenrelay.api.routes import metrics as metrics_route
from tokenrelay.api.state import AppState
from tokenrelay.api.webhooks import dispatch_webhooks
from tokenrelay.shared import redis_version
from tokenrelay.shared.settings import Settings
from tokenrelay.shared.version import VERSION


def create_app(settings: Settings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = AppState.build(settings)
        try:
            await redis_version.check_async(state.redis, settings)
        except redis_version.RedisTooOld:
            await state.close()
            raise
        app.state.tokenrelay = state
        state.hub.start()
        reaper = asyncio.create_task(reap_forever(state), name="lease-reaper")
        webhooks = asyncio.create_task(dispatch_webhooks(state), name="webhook-dispatcher")
        feeder_loop = BatchFeeder(state, app.state.metrics).run_forever()
        feeder = asyncio.create_task(feeder_loop, name="batch-feeder")
        watch = asyncio.create_task(state.connector.follow_primary_async(), name="primary-watch")
        try:
            yield
        finally:
            await background.stop((reaper, webhooks, feeder, watch))
            await state.close()

    app = FastAPI(
        title="tokenrelay",
        summary="OpenAI-compatible LLM gateway: global admission, queueing, streaming.",
        version=VERSION,
        lifespan=lifespan,
        docs_url="/docs" if settings.docs_enabled else None,
        redoc_url="/redoc" if settings.docs_enabled else None,
        openapi_url="/openapi.json" if settings.docs_enabled else None,
    )
    errors.install(app)
    upload_limit = settings.file_max_bytes + files.MULTIPART_OVERHEAD_BYTES
    app.add_middleware(
        BodySizeLimit,
        max_bytes=settings.max_request_bytes,
        path_limits={"/v1/files": (upload_limit, "TOKENRELAY_FILE_MAX_BYTES")},
    )
    metrics = Metrics.from_environment()
    app.state.metrics = metrics
    app.add_middleware(RequestLog, metrics=metrics, log_prompts=settings.log_prompts)
    app.add_middleware(RequestId)
    for router in (
        chat.router,
        completions.router,
        article_clients.router,
        jobs.router,
        files.router,
        batches.router,
        models.router,
        health.router,
        cluster.router,
        metrics_route.router,
    ):
        app.include_router(router)
    if settings.console_enabled:
        app.include_router(console.router)
    return app


def create_app_from_env() -> FastAPI:
    """Entry point for uvicorn (`factory=True`): settings from `TOKENRELAY_*`, the process's
    garbage collector tuned (`gc_tuning`)."""
    app = create_app(Settings())
    gc_tuning.tune()
    return app
