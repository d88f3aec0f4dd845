"""`api.responses.events`: a job's events as the Responses stream, at the byte level where a
client parses them, numbered by the job's events alone (a resume after N sends exactly the
rest of the first rendering), and the response object they build."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tokenrelay.api.responses.conversation import Plan
from tokenrelay.api.responses.events import ResponseEvents
from tokenrelay.api.responses.objects import Echo, ResponseShell
from tokenrelay.shared.events import Done, Error, Event, Started, TokenChunk, TokenLogprob, Usage

USAGE = Usage(prompt_tokens=5, completion_tokens=3, total_tokens=8)
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def shell(**plan: Any) -> ResponseShell:
    return ResponseShell(
        id="resp_j1", job_id="j1", created_at=1.5, echo=Echo(model="m"), plan=Plan(**plan)
    )


def job(*texts: str, finish: str = "stop") -> list[Event]:
    chunks: list[Event] = [TokenChunk(text=text, tokens=1) for text in texts]
    done = Done(finish_reason=finish, usage=USAGE)  # type: ignore[arg-type]
    return [Started(worker="w", prompt_tokens=5), *chunks, done]


def render(events: ResponseEvents, job_events: list[Event]) -> bytes:
    return events.created() + b"".join(events.feed(e, finished_at=9.0) for e in job_events)


def parse(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    """(SSE `event`, parsed data) of each event; checks the two name the same type."""
    out = []
    for block in raw.decode().split("\n\n")[:-1]:
        kind_line, data_line = block.split("\n")
        kind = kind_line.removeprefix("event: ")
        data = json.loads(data_line.removeprefix("data: "))
        assert data["type"] == kind
        out.append((kind, data))
    return out


def test_a_text_reply_streams_openais_event_sequence_numbered_from_zero() -> None:
    events = parse(render(ResponseEvents(shell()), job("Hel", "lo")))
    assert [kind for kind, _ in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [data["sequence_number"] for _, data in events] == list(range(10))
    assert events[0][1]["response"]["status"] == "in_progress"
    assert events[2][1]["item"] == {
        "id": "msg_j1_0",
        "type": "message",
        "status": "in_progress",
        "role": "assistant",
        "content": [],
    }
    assert events[6][1]["text"] == "Hello"
    done = events[-1][1]["response"]
    assert done["status"] == "completed"
    assert done["completed_at"] == 9.0
    assert done["output"][0]["content"][0]["text"] == "Hello"
    assert done["usage"] == {
        "input_tokens": 5,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 3,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 8,
    }


def test_a_text_delta_is_exactly_these_bytes() -> None:
    events = ResponseEvents(shell())
    events.created()
    events.feed(Started(worker="w", prompt_tokens=5))
    first = events.text('a "quoted"\nline é')
    kind = "response.output_text.delta"
    head = f'event: {kind}\ndata: {{"type":"{kind}","item_id":"msg_j1_0","output_index":0,'
    expected_delta = (
        head + '"content_index":0,"delta":"a \\"quoted\\"\\nline é","logprobs":[],'
        '"sequence_number":4}\n\n'
    )
    assert first.endswith(expected_delta.encode())
    assert (
        events.text("b")
        == (head + '"content_index":0,"delta":"b","logprobs":[],"sequence_number":5}\n\n').encode()
    )


def test_a_reply_cut_by_max_output_tokens_ends_incomplete() -> None:
    events = parse(render(ResponseEvents(shell()), job("abc", finish="length")))
    assert events[-1][0] == "response.incomplete"
    response = events[-1][1]["response"]
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["output"][0]["status"] == "incomplete"


def test_a_forced_call_streams_a_function_call_item_with_stable_ids() -> None:
    plan = {"parse_calls": True, "namespaces": {"get_weather": "weather"}}
    pieces = [CALL[i : i + 7] for i in range(0, len(CALL), 7)]
    events = parse(render(ResponseEvents(shell(**plan)), job(*pieces)))
    kinds = [kind for kind, _ in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-4:] == [
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert "response.output_text.delta" not in kinds
    added = events[2][1]["item"]
    assert (added["id"], added["call_id"], added["name"]) == ("fc_j1_0", "call_j1_0", "get_weather")
    arguments = "".join(
        data["delta"] for kind, data in events if kind == "response.function_call_arguments.delta"
    )
    assert json.loads(arguments) == {"city": "Paris"}
    item = events[-1][1]["response"]["output"][0]
    assert item["type"] == "function_call"
    assert item["namespace"] == "weather"
    assert item["arguments"] == arguments


def test_text_then_a_call_then_text_are_three_items() -> None:
    events = ResponseEvents(shell(parse_calls=True), emit=False)
    for event in job("Let me look.", CALL, "Done."):
        events.feed(event)
    assert events.final is not None
    output = events.final.output
    assert [(item.type, item.id) for item in output] == [
        ("message", "msg_j1_0"),
        ("function_call", "fc_j1_1"),
        ("message", "msg_j1_2"),
    ]


@pytest.mark.parametrize("plan", [{}, {"parse_calls": True}])
def test_a_resume_after_n_sends_exactly_the_rest_of_the_first_rendering(
    plan: dict[str, Any],
) -> None:
    job_events = job("Hi", " there", CALL[:20], CALL[20:], " bye")
    whole = render(ResponseEvents(shell(**plan)), job_events)
    blocks = [block + b"\n\n" for block in whole.split(b"\n\n")[:-1]]
    for after in range(-1, len(blocks) + 1):
        resumed = render(ResponseEvents(shell(**plan), skip_through=after), job_events)
        assert resumed == b"".join(blocks[after + 1 :]), after


def test_a_poll_builds_the_same_object_as_the_stream() -> None:
    job_events = job("Hi", CALL, finish="length")
    streamed = ResponseEvents(shell(parse_calls=True))
    polled = ResponseEvents(shell(parse_calls=True), emit=False)
    assert render(polled, job_events) == b""
    render(streamed, job_events)
    assert polled.final == streamed.final


def test_a_snapshot_shows_the_open_item_in_progress() -> None:
    events = ResponseEvents(shell(), emit=False)
    assert events.snapshot().status == "queued"
    events.feed(Started(worker="w", prompt_tokens=5))
    events.feed(TokenChunk(text="partial", tokens=1))
    snapshot = events.snapshot()
    assert snapshot.status == "in_progress"
    assert snapshot.output[0].status == "in_progress"
    assert snapshot.output[0].content[0].text == "partial"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("error_type", "status"), [("worker_lost", "failed"), ("cancelled", "cancelled")]
)
def test_a_job_error_is_an_error_event_then_response_failed(error_type: str, status: str) -> None:
    job_events: list[Event] = [
        Started(worker="w", prompt_tokens=5),
        TokenChunk(text="part", tokens=1),
        Error(error_type=error_type, message="it broke"),
    ]
    events = parse(render(ResponseEvents(shell()), job_events))
    kinds = [kind for kind, _ in events]
    assert kinds[-3:] == ["response.output_item.done", "error", "response.failed"]
    error = events[-2][1]
    assert (error["code"], error["message"]) == (error_type, "it broke")
    response = events[-1][1]["response"]
    assert response["status"] == status
    assert response["error"] == {"code": error_type, "message": "it broke"}
    assert response["output"][0]["status"] == "incomplete"


def test_a_continued_jobs_second_start_adds_no_event() -> None:
    events = ResponseEvents(shell())
    events.created()
    assert events.feed(Started(worker="w", prompt_tokens=5))
    assert events.feed(Started(worker="w2", prompt_tokens=5, attempt=2)) == b""


def test_lost_redis_reuses_the_last_number() -> None:
    events = ResponseEvents(shell())
    events.created()
    events.feed(Started(worker="w", prompt_tokens=5))
    [(kind, data)] = parse(events.interrupted("redis_unavailable", "lost"))
    assert (kind, data["sequence_number"]) == ("error", 1)
    assert events.text("x")  # numbering goes on from 2: the log's events shift nothing
    assert events.last_sequence_number == 4


def test_log_probabilities_ride_on_the_delta_and_the_part() -> None:
    entry = TokenLogprob(token="a", bytes=[97], logprob=-0.5, top_logprobs=[])
    events = ResponseEvents(shell(logprobs=True))
    events.created()
    events.feed(Started(worker="w", prompt_tokens=5))
    raw = events.feed(TokenChunk(text="a", tokens=1, logprobs=[entry]))
    delta = parse(raw)[-1][1]
    assert delta["logprobs"] == [entry.model_dump()]
    events.feed(Done(finish_reason="stop", usage=USAGE))
    assert events.final is not None
    assert events.final.output[0].content[0].logprobs == [entry]  # type: ignore[union-attr]
