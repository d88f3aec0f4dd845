"""Which tool-call parser reads a model's replies (`api.openai.tool_calls`): the one the
model's workers publish (their `TOKENRELAY_TOOL_CALL_PARSER`, `shared.redis.model_limits`),
so that each model of a cluster gets its own; this API process's own setting only until a
worker of the model has published one (or where a worker's is unknown here)."""

from __future__ import annotations

import logging
from typing import get_args

from tokenrelay.api.openai.tool_calls import ToolCallParser
from tokenrelay.api.openai.tools import ToolSelection
from tokenrelay.api.state import AppState
from tokenrelay.shared.settings import ToolCallParserName

log = logging.getLogger(__name__)

PARSER_NAMES: tuple[ToolCallParserName, ...] = get_args(ToolCallParserName)


async def parser_name(state: AppState, model: str) -> ToolCallParserName:
    """The name of the parser that reads `model`'s replies."""
    limits = await state.prompt_fit.limits(model)
    published = limits.tool_call_parser if limits is not None else ""
    for name in PARSER_NAMES:
        if name == published:
            return name
    if published:
        log.warning(
            "the workers of model %r use tool-call parser %r, unknown to this API process; "
            "using %r (TOKENRELAY_TOOL_CALL_PARSER)",
            model,
            published,
            state.settings.tool_call_parser,
        )
    return state.settings.tool_call_parser


async def tool_call_parser(
    state: AppState, model: str, tools: ToolSelection
) -> ToolCallParser | None:
    """A parser for one reply of `model` to a request with `tools`; None where the request
    parses no calls (no tools, or `tool_choice` `none`)."""
    if not tools.parse:
        return None
    return ToolCallParser(
        tools.parallel,
        name=await parser_name(state, model),
        functions=[tool.name for tool in tools.tools],
    )
