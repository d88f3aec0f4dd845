"""Which request fields tokenrelay implements, accepts without effect, or refuses.

Nothing a client sends is silently dropped. Request models forbid undeclared fields (an
unknown name is a 400 that names it); OpenAI fields tokenrelay does not implement are
declared with `refused(...)`, so the OpenAPI schema lists them (marked
`"x-tokenrelay": "refused"`) and `check_refused` answers a 400 naming the field whenever a
request sets one (a JSON `null` counts as not set, as OpenAI treats it). Fields that only
describe the caller to OpenAI (`user`, `metadata`, ...) are declared with `no_effect(...)`:
accepted, marked `"x-tokenrelay": "no-effect"`, and documented as such; a response to a
request that set one names it in the `x-tokenrelay-no-effect` header (`no_effect_header`),
so nothing is accepted with no effect silently.
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tokenrelay.shared.errors import InvalidRequest

SUPPORT_KEY = "x-tokenrelay"
REFUSED = "refused"
NO_EFFECT = "no-effect"
NO_EFFECT_HEADER = "x-tokenrelay-no-effect"


class StrictPart(BaseModel):
    """A part of a request: undeclared fields are refused (400), never dropped."""

    model_config = ConfigDict(extra="forbid")


def refused(reason: str) -> Any:
    """A declared field that any non-null value makes a 400: `reason` says why."""
    return Field(
        default=None,
        description=f"Not supported: {reason}. Refused with a 400 when set.",
        json_schema_extra={SUPPORT_KEY: REFUSED},
    )


def no_effect(description: str, default: Any = None) -> Any:
    """A declared field that is accepted and changes nothing here."""
    return Field(
        default=default,
        description=f"Accepted, no effect on generation: {description}.",
        json_schema_extra={SUPPORT_KEY: NO_EFFECT},
    )


def support(model: type[BaseModel], name: str) -> str | None:
    """The field's mark (`refused`, `no-effect`), None for an implemented field."""
    extra = model.model_fields[name].json_schema_extra
    return extra.get(SUPPORT_KEY) if isinstance(extra, dict) else None  # type: ignore[return-value]


@functools.cache
def _refused_fields(model: type[BaseModel]) -> tuple[tuple[str, str], ...]:
    """The refused fields of `model`, each with why (reading them off pydantic's field info
    for every request took ~50 µs of each request's validation)."""
    refused_fields = []
    for name, info in model.model_fields.items():
        if support(model, name) == REFUSED:
            reason = (info.description or "").removeprefix("Not supported: ")
            refused_fields.append((name, reason.removesuffix(". Refused with a 400 when set.")))
    return tuple(refused_fields)


@functools.cache
def _no_effect_fields(model: type[BaseModel]) -> tuple[str, ...]:
    return tuple(name for name in model.model_fields if support(model, name) == NO_EFFECT)


def set_with_no_effect(body: BaseModel, prefix: str = "") -> list[str]:
    """The fields marked `no-effect` that `body` sets (a JSON `null` counts as not set),
    each named with `prefix`."""
    return [
        f"{prefix}{name}"
        for name in _no_effect_fields(type(body))
        if getattr(body, name) is not None
    ]


def no_effect_header(fields: list[str]) -> dict[str, str]:
    """The response header naming the no-effect `fields` a request set (none: no header)."""
    return {NO_EFFECT_HEADER: ",".join(fields)} if fields else {}


def check_refused(body: BaseModel, prefix: str = "") -> None:
    """Raise `InvalidRequest` naming the first refused field `body` sets."""
    for name, reason in _refused_fields(type(body)):
        if getattr(body, name) is not None:
            field = f"{prefix}{name}"
            raise InvalidRequest(
                f"`{field}` is not supported by tokenrelay ({reason}); it is refused rather "
                "than ignored",
                param=field,
            )


def unknown_field_message(field: str) -> str:
    return (
        f"`{field}` is not a field of this endpoint (neither OpenAI's API nor a vLLM extension "
        "that tokenrelay implements); it is refused rather than ignored"
    )
