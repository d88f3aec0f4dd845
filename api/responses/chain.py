"""`previous_response_id`: the conversation a response continues, rebuilt from the store.

Each stored response keeps its own input items, and its output once settled; following the
chain of `previous_response_id`s back gives, oldest first, every response's input and
output items. Instructions are not items: a response's `instructions` apply to it alone and
are not carried over (as OpenAI does). Any API process can do this: the chain lives in
Redis, under the caller's owner.
"""

from __future__ import annotations

from tokenrelay.api.deps import Caller
from tokenrelay.api.responses import store
from tokenrelay.api.responses.items import ITEMS, InputItem
from tokenrelay.api.responses.retrieve import current
from tokenrelay.api.state import AppState
from tokenrelay.shared.errors import InvalidRequest, ResponseNotFound

PARAM = "previous_response_id"


async def history(state: AppState, caller: Caller, previous_id: str) -> list[InputItem]:
    """The items of the chain that ends with `previous_id`, oldest first; 404 for an id the
    caller has no stored response by, 400 for one still running."""
    links = []
    next_id: str | None = previous_id
    while next_id is not None:
        try:
            stored = await store.load(state, caller, next_id)
        except ResponseNotFound:
            raise ResponseNotFound(
                f"`{PARAM}`: no stored response {next_id!r} (unknown, expired, another API "
                "key's, or created with `store: false`)",
                param=PARAM,
            ) from None
        response = await current(state, stored)
        if response.status in ("queued", "in_progress"):
            raise InvalidRequest(
                f"`{PARAM}`: response {next_id!r} is still {response.status}; continue it once "
                "it has ended",
                param=PARAM,
            )
        links.append((stored.input, [item.model_dump(mode="json") for item in response.output]))
        next_id = stored.shell.echo.previous_response_id
    items = [item for inputs, outputs in reversed(links) for item in inputs + outputs]
    return ITEMS.validate_python(items)
