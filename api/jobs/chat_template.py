"""A chat's prompt text as the workers render it, so that an API node counts its tokens exactly.

The worker renders a chat with transformers' `apply_chat_template`; the API may not import
transformers, so this applies the same template (`model_limits.ChatTemplate`, which the
workers publish) the way transformers does: a sandboxed Jinja environment with
`trim_blocks` and `lstrip_blocks`, loop controls, transformers' `tojson` (no HTML escaping),
`raise_exception`, `strftime_now`, `dict` and an underscore-guarded `namespace`, a
`{% generation %}` block that renders its body, and the variables `messages`, `tools`,
`documents`, `add_generation_prompt` and the tokenizer's special tokens. The messages and
tools are the worker's own dicts (`ChatMessage.template_form`, `FunctionTool.template_form`).
`test_chat_template.py` checks the counts against the worker's on the tiny model.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from tokenrelay.shared.generation import ChatMessage, FunctionTool
from tokenrelay.shared.redis.model_limits import ChatTemplate


class ChatTemplateError(ValueError):
    """The template cannot render this chat (it raised, or the model has none)."""


def render_chat(
    template: ChatTemplate | None, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool]
) -> str:
    """The prompt text the worker tokenizes for `messages` and `tools`."""
    source = template.source(bool(tools)) if template is not None else None
    if template is None or source is None:
        raise ChatTemplateError("the model has no chat template")
    try:
        return _compile(source).render(
            messages=[m.template_form() for m in messages],
            tools=[tool.template_form() for tool in tools] or None,
            documents=None,
            add_generation_prompt=True,
            **template.special_tokens,
        )
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the chat template cannot render this chat: {exc}") from exc


class _Generation(jinja2.ext.Extension):
    """transformers' `{% generation %}` block (it marks the assistant's tokens for training
    masks): here it renders its body."""

    tags = {"generation"}  # noqa: RUF012 (Jinja reads it from the class)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


class _Namespace(jinja2.utils.Namespace):
    """transformers' guard: a template may not store underscore names on a namespace."""

    def __init__(*args: Any, **kwargs: Any) -> None:
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check_name(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name: str, value: Any) -> None:
        _Namespace._check_name(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"chat templates cannot store underscore attributes on a namespace: {name!r}"
            )


class _Dict:
    """`dict(...)` for templates, without the class's attributes."""

    def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict(*args, **kwargs)

    def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
        return dict.fromkeys(*args, **kwargs)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@functools.lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, jinja2.ext.loopcontrols]
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    environment.globals["dict"] = _Dict()
    environment.globals["namespace"] = _Namespace
    try:
        return environment.from_string(source)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"the model's chat template does not compile: {exc}") from exc
