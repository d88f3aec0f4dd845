"""The Responses API through real processes (`tokenrelay api`, `tokenrelay worker`, the tiny
model) with the official `openai` client, unchanged: `responses.create` (plain, a forced
function call, `text.format` JSON), the `responses.stream(...)` helpers, `retrieve`,
`input_items`, `store=False`, `previous_response_id` across two API processes, and the no-effect
header on what the Codex CLI sends by default. Background runs, resume and cancel are in
`test_responses_background.py`."""

from __future__ import annotations

import io
import json
from typing import Any

import httpx
import openai
import pytest

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.testing.polling import eventually

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 12},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
}
PICK = {
    "type": "object",
    "properties": {"pick": {"enum": ["apples", "pears"]}},
    "required": ["pick"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    # Token by token (no coalescing), so a stream's text arrives in many deltas.
    return make_module_cluster(
        {"TOKENRELAY_MAX_INFLIGHT": "8", "TOKENRELAY_FLUSH_INTERVAL_MS": "0"}
    )


def create(client: openai.OpenAI, **fields: Any) -> Any:
    options: dict[str, Any] = {"temperature": 0, "max_output_tokens": 12, **fields}
    return client.responses.create(model=MODEL_NAME, **options)


def test_create_answers_a_stored_response_that_retrieve_returns(client: openai.OpenAI) -> None:
    response = create(client, input="tell me about the sea", instructions="be brief")
    assert response.id.startswith("resp_")
    assert response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.model == MODEL_NAME
    assert response.instructions == "be brief"
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text == message.content[0].text
    assert response.usage is not None
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 12
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    again = client.responses.retrieve(response.id)
    assert again.to_dict() == response.to_dict()


def test_a_named_tool_choice_answers_a_valid_function_call(client: openai.OpenAI) -> None:
    response = create(
        client,
        input="what is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=200,
    )
    assert response.status == "completed"
    [call] = response.output
    assert call.type == "function_call"
    assert call.name == "get_weather"
    arguments = json.loads(call.arguments)
    assert set(arguments) == {"city", "unit"}
    assert arguments["unit"] in ("celsius", "fahrenheit")
    assert call.call_id == f"call_{response.id.removeprefix('resp_')}_0"
    assert client.responses.retrieve(response.id).output[0].call_id == call.call_id


def test_text_format_json_schema_answers_json_matching_it(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["n", "ok"],
        "additionalProperties": False,
    }
    response = create(
        client,
        input="give me a number",
        text={"format": {"type": "json_schema", "name": "number", "schema": schema}},
        temperature=1.0,
        max_output_tokens=60,
    )
    assert response.status == "completed"
    value = json.loads(response.output_text)
    assert set(value) == {"n", "ok"} and isinstance(value["ok"], bool)
    assert response.text.format.type == "json_schema"


def test_the_stream_helpers_see_numbered_events_and_the_final_response(
    client: openai.OpenAI,
) -> None:
    # A grammar ends the reply (`completed`, which `get_final_response` needs), where the
    # tiny model's own text runs to `max_output_tokens`.
    with client.responses.stream(
        model=MODEL_NAME,
        input="pick one",
        text={"format": {"type": "json_schema", "name": "pick", "schema": PICK}},
        temperature=0,
        max_output_tokens=40,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-1] == "response.completed"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) > 1
    assert "".join(deltas) == final.output_text
    assert json.loads(final.output_text)["pick"] in ("apples", "pears")
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_a_streamed_forced_call_arrives_as_argument_deltas(client: openai.OpenAI) -> None:
    stream = create(
        client,
        input="weather?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=200,
        stream=True,
    )
    events = list(stream)
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(deltas) > 1 and "".join(deltas) == done.arguments
    assert json.loads(done.arguments)["unit"] in ("celsius", "fahrenheit")
    assert events[-1].type == "response.completed"
    assert events[-1].response.output[0].arguments == done.arguments


def test_input_items_are_listed_newest_first_and_paged(client: openai.OpenAI) -> None:
    response = create(
        client,
        input=[
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "input_text", "text": "second"}]},
        ],
        max_output_tokens=2,
    )
    texts = [item.content[0].text for item in client.responses.input_items.list(response.id)]
    assert texts == ["second", "ok", "first", "be brief"]
    page = client.responses.input_items.list(response.id, order="asc", limit=3)
    assert [item.content[0].text for item in page.data] == ["be brief", "first", "ok"]
    assert page.has_more
    rest = client.responses.input_items.list(response.id, order="asc", after=page.data[-1].id)
    assert [item.content[0].text for item in rest.data] == ["second"]
    assert not rest.has_more
    assert [item.role for item in page.data] == ["developer", "user", "assistant"]


def test_store_false_leaves_nothing_retrievable(client: openai.OpenAI) -> None:
    response = create(client, input="hi", store=False, max_output_tokens=2)
    assert response.store is False
    with pytest.raises(openai.NotFoundError) as caught:
        client.responses.retrieve(response.id)
    assert caught.value.code == "response_not_found"
    with pytest.raises(openai.NotFoundError):
        create(client, input="and?", previous_response_id=response.id)
    with pytest.raises(openai.BadRequestError) as refused:
        create(client, input="hi", store=False, background=True)
    assert refused.value.param == "store"  # type: ignore[attr-defined]


def test_previous_response_id_continues_a_chain_across_two_api_processes(
    cluster: Cluster, client: openai.OpenAI
) -> None:
    instructions = "Answer in the voice of a lighthouse keeper. " * 8
    first = create(client, input="my name is Ann", instructions=instructions, max_output_tokens=6)
    bare = create(client, input="my name is Ann", max_output_tokens=1)
    home = cluster.base_url
    cluster.start_api()  # a second API process on the same Redis
    try:
        with openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="k", max_retries=0) as other:
            second = create(other, input="what is my name?", previous_response_id=first.id)
            third = create(client, input="and?", previous_response_id=second.id)
            alone = create(other, input="what is my name?", max_output_tokens=1)
            with pytest.raises(openai.NotFoundError) as caught:
                create(other, input="x", previous_response_id="resp_" + "0" * 32)
    finally:
        cluster.api_port = int(home.rsplit(":", 1)[1])
    assert caught.value.param == "previous_response_id"  # type: ignore[attr-defined]
    assert second.previous_response_id == first.id
    usage = [r.usage for r in (first, bare, second, third, alone)]
    assert all(u is not None for u in usage)
    first_u, bare_u, second_u, third_u, alone_u = usage  # type: ignore[misc]
    instructions_cost = first_u.input_tokens - bare_u.input_tokens
    assert instructions_cost > 40
    # The chain's input and output come before the new input...
    assert second_u.input_tokens > bare_u.input_tokens + first_u.output_tokens
    assert third_u.input_tokens > second_u.input_tokens + second_u.output_tokens
    # ...and the first response's instructions are not carried over.
    assert (
        second_u.input_tokens < bare_u.input_tokens + first_u.output_tokens + alone_u.input_tokens
    )


def test_codex_clis_default_fields_are_accepted_and_named_in_a_header(cluster: Cluster) -> None:
    body = {
        "model": MODEL_NAME,
        "stream": True,
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "rules"}],
            },
            {
                "type": "message",
                "role": "user",
                "content": [{"type": "input_text", "text": "hello"}],
            },
        ],
        "tools": [
            {"type": "namespace", "name": "ns", "description": "group", "tools": [WEATHER]},
        ],
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "session-1",
        "client_metadata": {"originator": "codex_exec"},
        "max_output_tokens": 8,
    }
    with (
        httpx.Client(base_url=cluster.base_url, timeout=60) as http,
        http.stream("POST", "/v1/responses", json=body) as response,
    ):
        assert response.status_code == 200, response.read()
        named = response.headers["x-tokenrelay-no-effect"].split(",")
        lines = list(response.iter_lines())
    assert sorted(named) == ["client_metadata", "include", "prompt_cache_key", "reasoning"]
    kinds = [line.removeprefix("event: ") for line in lines if line.startswith("event: ")]
    assert kinds[0] == "response.created"
    assert kinds[-1] in ("response.completed", "response.incomplete")
    plain = httpx.post(
        f"{cluster.base_url}/v1/responses",
        json={"model": MODEL_NAME, "input": "hi", "max_output_tokens": 2, "store": False},
        timeout=60,
    )
    assert plain.status_code == 200
    assert "x-tokenrelay-no-effect" not in plain.headers


def test_input_tokens_counts_what_usage_will_say(client: openai.OpenAI) -> None:
    fields: dict[str, Any] = {
        "instructions": "be brief",
        "input": [
            {"role": "user", "content": "what is the weather in Paris?"},
            {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        ],
        "tools": [WEATHER],
    }
    counted = client.responses.input_tokens.count(model=MODEL_NAME, **fields)
    assert counted.object == "response.input_tokens"
    response = create(client, max_output_tokens=1, **fields)
    assert response.usage is not None
    assert counted.input_tokens == response.usage.input_tokens


def test_a_batch_may_name_the_responses_endpoint(client: openai.OpenAI) -> None:
    def line(custom_id: str, **body: Any) -> str:
        # Greedy: a sampled reply of the tiny model may end at once, with no message item.
        body = {
            "model": MODEL_NAME,
            "input": f"say {custom_id}",
            "max_output_tokens": 3,
            "temperature": 0,
            **body,
        }
        request = {"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": body}
        return json.dumps(request) + "\n"

    upload = (line("a") + line("b", instructions="be brief")).encode()
    input_file = client.files.create(file=("in.jsonl", io.BytesIO(upload)), purpose="batch")
    batch = client.batches.create(
        input_file_id=input_file.id, endpoint="/v1/responses", completion_window="24h"
    )
    eventually(
        lambda: client.batches.retrieve(batch.id).status in ("completed", "failed"),
        timeout_s=60,
        what="the batch to end",
    )
    done = client.batches.retrieve(batch.id)
    assert done.status == "completed", done
    assert done.output_file_id is not None
    results = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert sorted(r["custom_id"] for r in results) == ["a", "b"]
    for result in results:
        body = result["response"]["body"]
        assert body["object"] == "response"
        assert body["status"] in ("completed", "incomplete")
        assert body["usage"]["output_tokens"] <= 3
        assert body["output"][0]["type"] == "message"
    refused = client.files.create(
        file=("bad.jsonl", io.BytesIO(line("c", previous_response_id="resp_x").encode())),
        purpose="batch",
    )
    bad = client.batches.create(
        input_file_id=refused.id, endpoint="/v1/responses", completion_window="24h"
    )
    eventually(
        lambda: client.batches.retrieve(bad.id).status == "failed",
        timeout_s=60,
        what="the batch with a refused line to fail",
    )
    errors = client.batches.retrieve(bad.id).errors
    assert errors is not None and errors.data is not None
    assert errors.data[0].param == "body.previous_response_id"


def test_built_in_tools_and_unknown_ids_are_refused_by_name(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        create(client, input="hi", tools=[{"type": "web_search"}])
    assert caught.value.param == "tools.0.type"  # type: ignore[attr-defined]
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_" + "0" * 32)
    with pytest.raises(openai.NotFoundError):
        client.responses.input_items.list("resp_nope")
