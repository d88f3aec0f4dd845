"""Request dependencies as `Annotated` aliases, so route signatures stay flat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from tokenrelay.api.state import AppState
from tokenrelay.shared.errors import Forbidden, Unauthorized
from tokenrelay.shared.redis.rq_jobs import Priority

ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Caller:
    """Who is calling: jobs belong to their owner, and only their owner sees them."""

    owner: str
    is_admin: bool = False
    max_inflight: int | None = None
    priority: Priority = "normal"
    #: The caller's owner id under the previous owner-id secret, during a rotation.
    former_owner: str | None = None

    def owns(self, owner: str | None) -> bool:
        return owner is not None and owner in (self.owner, self.former_owner)


# Dependencies are `async def` although they never await: FastAPI runs a plain `def`
# dependency in its thread pool, a hop per dependency per request that, under a burst,
# queues behind the pool's 40 threads (refusals took hundreds of ms that way).


async def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.tokenrelay
    return state


StateDep = Annotated[AppState, Depends(get_state)]


async def get_caller(
    state: StateDep,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[
        str | None, Header(description="The API key, as Anthropic's clients send it.")
    ] = None,
) -> Caller:
    """The key's caller: sent as `Authorization: Bearer <key>` (OpenAI's clients) or as
    `x-api-key` (Anthropic's); with both, the bearer key counts."""
    if not state.keys.enabled:
        return Caller(owner=ANONYMOUS)
    scheme, _, key = (authorization or "").partition(" ")
    param = "authorization"
    if authorization is None and x_api_key is not None:
        scheme, key, param = "bearer", x_api_key, "x-api-key"
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized(
            "missing API key: send it as `Authorization: Bearer <key>` or `x-api-key: <key>`",
            param=param,
        )
    policy = state.keys.lookup(key.strip())
    if policy is None:
        raise Unauthorized("invalid API key", param=param)
    return Caller(
        owner=policy.owner,
        is_admin=policy.is_admin,
        max_inflight=policy.max_inflight,
        priority=policy.priority,
        former_owner=policy.former_owner,
    )


CallerDep = Annotated[Caller, Depends(get_caller)]


async def get_admin(state: StateDep, caller: CallerDep) -> Caller:
    """Operator-only routes: open without API keys; with keys, an admin key (else 403)."""
    if state.keys.enabled and not caller.is_admin:
        raise Forbidden("this route needs an admin API key (TOKENRELAY_ADMIN_API_KEYS)")
    return caller


AdminDep = Annotated[Caller, Depends(get_admin)]
