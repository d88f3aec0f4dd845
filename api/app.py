"""The FastAPI application factory."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator
from typing import Any

import redis.asyncio
from fastapi import FastAPI
from redis.asyncio.cluster import RedisCluster

from tokenrelay.api import background, errors, gc_tuning
from tokenrelay.api.anthropic import errors as anthropic_errors
from tokenrelay.api.api_keys import KeyRing
from tokenrelay.api.batches.feeder import BatchFeeder
from tokenrelay.api.batches.store import batch_webhook
from tokenrelay.api.jobs.placement import Placement
from tokenrelay.api.jobs.prompt_fit import PromptFit
from tokenrelay.api.jobs.reaper import reap_forever
from tokenrelay.api.jobs.record import job_webhook
from tokenrelay.api.metrics import Metrics
from tokenrelay.api.middleware.body_limit import BodySizeLimit
from tokenrelay.api.middleware.request_id import RequestId
from tokenrelay.api.middleware.request_log import RequestLog
from tokenrelay.api.responses.settle import settle_forever
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
    messages,
    models,
    pages,
    responses,
)
from tokenrelay.api.routes import metrics as metrics_route
from tokenrelay.api.state import AppState
from tokenrelay.api.streaming.drain import streams_end_before_drain
from tokenrelay.api.streaming.hub import StreamHub
from tokenrelay.api.webhooks.dispatcher import PayloadLoader, dispatch_webhooks
from tokenrelay.shared.redis import connect as redis_connect
from tokenrelay.shared.redis import server_version as redis_version
from tokenrelay.shared.redis.scripts import AsyncScripts
from tokenrelay.shared.settings import Settings
from tokenrelay.shared.version import VERSION

REDIS_POOL_WAIT_S = 5.0
BYTES_POOL_SIZE = 8
REDIS_CONNECT_TIMEOUT_S = 5.0  # an unreachable Redis (no RST) is a 503, not a 2-minute hang
REDIS_HEALTH_CHECK_S = 30


def build_state(settings: Settings, metrics: Metrics | None = None) -> AppState:
    """The process's Redis clients, script runners, stream hub, keys and prompt counter."""
    # A burst of requests waits briefly for a pooled connection instead of failing with
    # "Too many connections" (redis-py's default pool caps at 100 and refuses the rest);
    # the pool, and beside it the stream hub's one pub/sub connection, bound this
    # process's connections whatever the number of streams (`TOKENRELAY_REDIS_POOL_SIZE`).
    # Every call fails after `TOKENRELAY_API_REDIS_TIMEOUT_S` instead of hanging on a
    # server that stopped answering (a frozen primary never closes its connections), and
    # redis-py's retry reconnects, through the sentinels, to the primary they name.
    connector = redis_connect.RedisConnector(settings)
    options: dict[str, Any] = {
        "pool_wait_s": REDIS_POOL_WAIT_S,
        "socket_timeout": settings.api_redis_timeout_s,
        "socket_connect_timeout": REDIS_CONNECT_TIMEOUT_S,
        "health_check_interval": REDIS_HEALTH_CHECK_S,
    }
    client = connector.async_client(
        max_connections=settings.redis_pool_size, decode_responses=True, **options
    )
    control_scripts = AsyncScripts(client)
    prompt_fit = PromptFit(client)
    count = metrics.count_placement if metrics is not None else None
    placement = Placement(settings, control_scripts, prompt_fit, count)
    plane = redis_connect.stream_async_client(
        settings, max_connections=settings.redis_pool_size, decode_responses=True, **options
    )
    return AppState(
        settings=settings,
        redis=client,
        plane=client if plane is None else plane,
        redis_bytes=connector.async_client(
            max_connections=BYTES_POOL_SIZE, decode_responses=False, **options
        ),
        rq_connection=connector.sync_client(max_connections=settings.redis_pool_size, **options),
        scripts=control_scripts,
        plane_scripts=control_scripts if plane is None else AsyncScripts(plane),
        hub=StreamHub(client if plane is None else plane, plane_shared=plane is None),
        keys=KeyRing.from_settings(settings),
        prompt_fit=prompt_fit,
        placement=placement,
        connector=connector,
    )


def webhook_payloads(
    client: redis.asyncio.Redis, plane: redis.asyncio.Redis | RedisCluster
) -> dict[str, PayloadLoader]:
    """Each kind of webhook subject's loader, for the dispatcher (the features own their
    records): jobs' from the control Redis `client` and the token plane's `plane`."""
    return {
        "job": functools.partial(job_webhook, client, plane),
        "batch": functools.partial(batch_webhook, client),
    }


def create_app(settings: Settings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state = build_state(settings, app.state.metrics)
        try:
            await redis_version.check_async(state.redis, settings)
        except redis_version.RedisTooOld:
            await state.close()
            raise
        app.state.tokenrelay = state
        state.hub.start()
        reaper = asyncio.create_task(reap_forever(state), name="lease-reaper")
        webhooks = asyncio.create_task(
            dispatch_webhooks(state, webhook_payloads(state.redis, state.plane)),
            name="webhook-dispatcher",
        )
        feeder_loop = BatchFeeder(state, app.state.metrics).run_forever()
        feeder = asyncio.create_task(feeder_loop, name="batch-feeder")
        settler = asyncio.create_task(settle_forever(state), name="responses-settler")
        watch = asyncio.create_task(state.connector.follow_primary_async(), name="primary-watch")
        try:
            with streams_end_before_drain(state.hub, settings.api_drain_s):
                yield
        finally:
            await background.stop((reaper, webhooks, feeder, settler, watch))
            await state.close()

    app = FastAPI(
        title="tokenrelay",
        summary="OpenAI-compatible LLM gateway: global admission, queueing, streaming.",
        version=VERSION,
        lifespan=lifespan,
        docs_url=None,  # `routes/pages.py` serves `/docs` and `/redoc` without a CDN
        redoc_url=None,
        openapi_url="/openapi.json" if settings.docs_enabled else None,
    )
    errors.install(app, dialects=[anthropic_errors.DIALECT])
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
        messages.router,
        files.router,
        batches.router,
        responses.router,
        models.router,
        health.router,
        cluster.router,
        metrics_route.router,
        pages.index_router,
    ):
        app.include_router(router)
    if settings.docs_enabled:
        app.include_router(pages.docs_router)
    if settings.console_enabled:
        app.include_router(console.router)
    return app


def create_app_from_env() -> FastAPI:
    """Entry point for uvicorn (`factory=True`): settings from `TOKENRELAY_*`, the process's
    garbage collector tuned (`gc_tuning`)."""
    app = create_app(Settings())
    gc_tuning.tune()
    return app
