"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisClusterException, RedisError

from tokenrelay.api.deps import StateDep
from tokenrelay.api.error_docs import AUTH_ERRORS
from tokenrelay.api.errors import error_response
from tokenrelay.api.state import AppState
from tokenrelay.shared.errors import RedisUnavailable
from tokenrelay.shared.redis import connect as redis_connect

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive (it does not look at Redis)."""
    return {"status": "ok"}


@router.get("/health", response_model=None, responses={503: AUTH_ERRORS[503]})
async def health(state: StateDep) -> Response:
    """As vLLM and TGI answer it: 200 with an empty body when ready (as `/readyz`), else
    503 `redis_unavailable`."""
    if (problem := await _not_ready(state)) is not None:
        return error_response(problem)
    return Response(status_code=200)


@router.get("/readyz", response_model=None, responses={503: AUTH_ERRORS[503]})
async def readyz(state: StateDep) -> dict[str, str] | JSONResponse:
    """Ready when the Redis this process talks to is a primary (`ROLE`: a replica answers PING
    but refuses writes), and the token plane's own Redis, where it has one, answers PING; 503
    `redis_unavailable` otherwise."""
    if (problem := await _not_ready(state)) is not None:
        return error_response(problem)
    return {"status": "ready"}


async def _not_ready(state: AppState) -> RedisUnavailable | None:
    """Why this process is not ready, or None."""
    try:
        role = await state.redis.execute_command("ROLE")
    except (RedisError, OSError):
        return RedisUnavailable("Redis is unreachable")
    if not redis_connect.is_primary(role):
        return RedisUnavailable("Redis is a replica, not the primary")
    if state.plane is not state.redis:
        try:
            await state.plane.ping()
        except (RedisError, RedisClusterException, OSError):
            return RedisUnavailable("the token plane's Redis is unreachable")
    return None
