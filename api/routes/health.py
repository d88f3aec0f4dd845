"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from redis.exceptions import RedisError

from tokenrelay.api.deps import StateDep
from tokenrelay.api.error_docs import AUTH_ERRORS
from tokenrelay.api.errors import error_response
from tokenrelay.shared.errors import RedisUnavailable

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive (it does not look at Redis)."""
    return {"status": "ok"}


@router.get("/readyz", response_model=None, responses={503: AUTH_ERRORS[503]})
async def readyz(state: StateDep) -> dict[str, str] | JSONResponse:
    """Ready when Redis answers; 503 `redis_unavailable` otherwise."""
    try:
        await state.redis.ping()
    except (RedisError, OSError):
        return error_response(RedisUnavailable("Redis is unreachable"))
    return {"status": "ready"}
