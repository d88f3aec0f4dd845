"""Redis replies as text: clients without `decode_responses` (the worker's, scripts' replies
everywhere) give bytes, the others str; this is the one place that tells them apart."""

from __future__ import annotations

from typing import overload


@overload
def as_text(value: bytes | str) -> str: ...
@overload
def as_text(value: bytes | str | None) -> str | None: ...


def as_text(value: bytes | str | None) -> str | None:
    """`value` decoded as UTF-8 when it is bytes; str and None as they are."""
    return value.decode() if isinstance(value, bytes) else value
