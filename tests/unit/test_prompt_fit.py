"""Admission-time refusal of prompts that can never fit (`api.jobs.prompt_fit`), against what a
worker publishes (`shared.redis.model_limits`). Redis is fakeredis: nothing crosses processes here
(tests/test_e2e.py covers the real path)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import fakeredis
import fakeredis.aioredis
import pytest
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace

from tokenrelay.api.jobs.prompt_fit import PromptFit
from tokenrelay.shared.errors import ContextLengthExceeded
from tokenrelay.shared.generation import ChatMessage, FunctionTool, GenerationRequest
from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.model_limits import (
    LIMITS_TTL_S,
    ChatTemplate,
    LimitsPublisher,
    ModelLimits,
)

MODEL = "m"


def word_tokenizer() -> str:
    """One token per whitespace-separated word."""
    tokenizer = Tokenizer(WordLevel({"[UNK]": 0, "w": 1}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()  # type: ignore[assignment]
    return str(tokenizer.to_str())


@pytest.fixture
def server() -> Iterator[fakeredis.FakeServer]:
    yield fakeredis.FakeServer()


def publish(server: fakeredis.FakeServer, context: int, batch: int, tokenizer: str | None) -> None:
    client = fakeredis.FakeRedis(server=server)
    LimitsPublisher(MODEL, context, batch, tokenizer).publish(client)
    client.close()


def check(server: fakeredis.FakeServer, request: GenerationRequest) -> None:
    async def run() -> None:
        client = fakeredis.aioredis.FakeRedis(server=server, decode_responses=True)
        try:
            await PromptFit(client).check(request)
        finally:
            await client.aclose()

    asyncio.run(run())


def chat(words: int, max_tokens: int) -> GenerationRequest:
    content = " ".join(["w"] * words)
    return GenerationRequest(
        model=MODEL, messages=(ChatMessage(role="user", content=content),), max_tokens=max_tokens
    )


def test_limits_survive_the_round_trip_through_a_hash() -> None:
    limits = ModelLimits(context_tokens=4096, batch_tokens=1024, tokenizer_sha256="ab")
    fields = {str(k): str(v) for k, v in limits.to_hash().items()}
    assert ModelLimits.from_hash(fields) == limits
    assert ModelLimits.from_hash({k.encode(): v.encode() for k, v in fields.items()}) == limits
    assert ModelLimits.from_hash({}) is None
    assert limits.tokens_per_job == 1024


def test_the_tokenizer_is_stored_under_its_hash_and_both_keys_expire(
    server: fakeredis.FakeServer,
) -> None:
    publish(server, 100, 100, word_tokenizer())
    client = fakeredis.FakeRedis(server=server, decode_responses=True)
    sha = str(client.hget(keys.model_limits(MODEL), "tokenizer_sha256"))
    assert client.get(keys.tokenizer(sha)) == word_tokenizer()
    assert client.keys(keys.tokenizer("*")) == [keys.tokenizer(sha)]
    for key in (keys.model_limits(MODEL), keys.tokenizer(sha)):
        assert 0 < int(client.ttl(key)) <= LIMITS_TTL_S  # type: ignore[arg-type]
    client.delete(keys.tokenizer(sha))
    publish(server, 100, 100, word_tokenizer())
    assert client.get(keys.tokenizer(sha)) == word_tokenizer(), "sent again once lost"


def test_a_request_that_can_never_fit_is_refused_at_the_boundary(
    server: fakeredis.FakeServer,
) -> None:
    publish(server, context=100, batch=1000, tokenizer=word_tokenizer())
    # 71 words count as at least 70 tokens (one may merge across a template boundary).
    check(server, chat(71, max_tokens=30))
    with pytest.raises(ContextLengthExceeded) as refused:
        check(server, chat(71, max_tokens=31))
    assert refused.value.param == "messages"
    assert "maximum context length is 100 tokens" in str(refused.value)
    assert "at least 101 tokens (70 in the messages, 31 for the completion)" in str(refused.value)


def test_the_batch_budget_binds_when_it_is_the_smaller(server: fakeredis.FakeServer) -> None:
    publish(server, context=1000, batch=50, tokenizer=word_tokenizer())
    check(server, GenerationRequest(model=MODEL, prompt=" ".join(["w"] * 41), max_tokens=10))
    with pytest.raises(ContextLengthExceeded, match="batch holds at most 50") as refused:
        check(
            server,
            GenerationRequest(model=MODEL, prompt=" ".join(["w"] * 42), max_tokens=10),
        )
    assert refused.value.param == "prompt"


def test_without_published_limits_or_tokenizer_the_worker_decides(
    server: fakeredis.FakeServer,
) -> None:
    check(server, chat(5000, max_tokens=10))
    publish(server, context=100, batch=100, tokenizer=None)
    check(server, chat(5000, max_tokens=10))


def test_unreadable_limits_or_tokenizer_leave_the_decision_to_the_worker(
    server: fakeredis.FakeServer,
) -> None:
    client = fakeredis.FakeRedis(server=server)
    client.hset(keys.model_limits(MODEL), mapping={"context_tokens": "many"})
    check(server, chat(5000, max_tokens=10))
    assert ModelLimits.from_hash({"batch_tokens": "10"}) is None
    limits = ModelLimits(context_tokens=100, batch_tokens=100, tokenizer_sha256="f00")
    client.hset(keys.model_limits(MODEL), mapping=limits.to_hash())
    client.set(keys.tokenizer("f00"), '{"version": "from the future"}')
    check(server, chat(5000, max_tokens=10))
    client.close()


# A chat template that adds a default system prompt (five words) unless the chat opens with a
# system turn, three words per turn, the offered tools' names and descriptions, and one word
# to open the reply: with the word tokenizer, every word is a token.
TEMPLATE = (
    "{% if messages[0].role != 'system' %}you are a helpful assistant {% endif %}"
    "{% for m in messages %}{{ m.role }} {{ m.content }} end {% endfor %}"
    "{% for t in tools or [] %}tool {{ t.function.name }} {{ t.function.description }} "
    "{% endfor %}assistant"
)
CONTEXT = 100


def publish_with_template(server: fakeredis.FakeServer) -> None:
    client = fakeredis.FakeRedis(server=server)
    template = ChatTemplate(templates={"default": TEMPLATE})
    LimitsPublisher(MODEL, CONTEXT, CONTEXT, word_tokenizer(), template).publish(client)
    client.close()


def question(max_tokens: int, description_words: int = 0) -> GenerationRequest:
    """One word asked (nine tokens with the template), with a tool described in so many words."""
    tools: tuple[FunctionTool, ...] = ()
    if description_words:
        tools = (FunctionTool(name="f", description=" ".join(["w"] * description_words)),)
    return GenerationRequest(
        model=MODEL,
        messages=(ChatMessage(role="user", content="w"),),
        max_tokens=max_tokens,
        tools=tools,
    )


def test_what_the_chat_template_adds_counts_at_admission(server: fakeredis.FakeServer) -> None:
    """A short question with `max_tokens` just under the window, the common mistake: its
    contents fit, the template's system prompt and markup do not."""
    publish(server, CONTEXT, CONTEXT, word_tokenizer())
    check(server, question(CONTEXT - 5))  # no template published: the worker decides
    publish_with_template(server)
    with pytest.raises(ContextLengthExceeded, match="the request asks for at least"):
        check(server, question(CONTEXT - 5))
    check(server, question(CONTEXT - 9))  # nine tokens of prompt: exactly the window


def test_the_tools_text_counts_at_admission(server: fakeredis.FakeServer) -> None:
    publish_with_template(server)
    check(server, question(50, description_words=5))
    with pytest.raises(ContextLengthExceeded):
        check(server, question(50, description_words=45))  # 9 + 47 + 50 tokens
