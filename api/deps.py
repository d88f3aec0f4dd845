"""Request dependencies as `Annotated` aliases, so route signatures stay flat."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, Header, Request

from api.state import AppState, hash_key
from shared.errors import Unauthorized
from shared.settings import Settings

ANONYMOUS = "anonymous"


@dataclass(frozen=True)
class Caller:
    """Who is calling: jobs belong to their owner, and only their owner sees them."""

    owner: str


def get_state(request: Request) -> AppState:
    state: AppState = request.app.state.tokenrelay
    return state


def get_settings(request: Request) -> Settings:
    return get_state(request).settings


StateDep = Annotated[AppState, Depends(get_state)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def get_caller(state: StateDep, authorization: Annotated[str | None, Header()] = None) -> Caller:
    if not state.api_key_hashes:
        return Caller(owner=ANONYMOUS)
    scheme, _, key = (authorization or "").partition(" ")
    if scheme.lower() != "bearer" or not key.strip():
        raise Unauthorized(
            "missing API key: send it as `Authorization: Bearer <key>`", param="authorization"
        )
    hashed = hash_key(key.strip())
    if hashed not in state.api_key_hashes:
        raise Unauthorized("invalid API key", param="authorization")
    return Caller(owner=hashed[:24])


CallerDep = Annotated[Caller, Depends(get_caller)]
