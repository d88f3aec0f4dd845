"""`GET /v1/responses/{id}/input_items`: a stored response's input items, paged as OpenAI
pages them (`order` `desc` by default, `after` an item id, `limit` 1 to 100)."""

from __future__ import annotations

from typing import Any, Literal

from tokenrelay.api.responses.objects import InputItemList
from tokenrelay.shared.errors import InvalidRequest


def page(
    items: list[dict[str, Any]], *, after: str | None, limit: int, order: Literal["asc", "desc"]
) -> InputItemList:
    ordered = items if order == "asc" else items[::-1]
    start = 0
    if after is not None:
        ids = [item.get("id") for item in ordered]
        if after not in ids:
            raise InvalidRequest(
                f"`after`: no input item {after[:80]!r} in this response", param="after"
            )
        start = ids.index(after) + 1
    data = ordered[start : start + limit]
    return InputItemList(
        data=data,
        first_id=data[0]["id"] if data else None,
        last_id=data[-1]["id"] if data else None,
        has_more=start + limit < len(ordered),
    )
