"""Liveness and readiness probes."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse, Response
from redis.exceptions import RedisError

from tokenrelay.api.deps import StateDep
from tokenrelay.api.error_docs import AUTH_ERRORS
from tokenrelay.api.errors import error_response
from tokenrelay.api.state import AppState
from tokenrelay.shared.errors import RedisUnavailable

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is alive (it does not look at Redis)."""
    return {"status": "ok"}


@router.get("/health", response_model=None, responses={503: AUTH_ERRORS[503]})
async def health(state: StateDep) -> Response:
    """As vLLM and TGI answer it: 200 with an empty body when ready (Redis answers), else
    503 `redis_unavailable`."""
    if not await _redis_answers(state):
        return error_response(RedisUnavailable("Redis is unreachable"))
    return Response(status_code=200)


@router.get("/readyz", response_model=None, responses={503: AUTH_ERRORS[503]})
async def readyz(state: StateDep) -> dict[str, str] | JSONResponse:
    """Ready when Redis answers; 503 `redis_unavailable` otherwise."""
    if not await _redis_answers(state):
        return error_response(RedisUnavailable("Redis is unreachable"))
    return {"status": "ready"}


async def _redis_answers(state: AppState) -> bool:
    try:
        await state.redis.ping()
    except (RedisError, OSError):
        return False
    return True
