"""The OpenAI surface as its clients call it, through real processes (`tokenrelay api`,
`tokenrelay worker`, the tiny model) with the `openai` package and httpx: model retrieval,
`/health`, list prompts, stream chunk shapes, request ids, resuming a finished job's events,
sampling controls (penalties, `logit_bias`, vLLM's `ignore_eos`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import httpx
import openai
import pytest
from pydantic import BaseModel, Field
from tokenizers import Tokenizer

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tokenrelay.testing.polling import eventually

MESSAGES = [{"role": "user", "content": "tell me about the sea"}]


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    return make_module_cluster({"TOKENRELAY_MAX_INFLIGHT": "8"})


def sse_data(response: httpx.Response) -> list[str]:
    return [line[6:] for line in response.iter_lines() if line.startswith("data: ")]


def test_models_retrieve_answers_the_served_model_and_404_for_others(
    client: openai.OpenAI,
) -> None:
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError) as caught:
        client.models.retrieve("gpt-4o")
    assert caught.value.code == "model_not_found"


def test_health_answers_200_with_an_empty_body_as_vllm_does(http: httpx.Client) -> None:
    response = http.get("/health")
    assert response.status_code == 200
    assert response.content == b""


def test_a_list_prompt_gets_one_choice_per_string(client: openai.OpenAI) -> None:
    prompts = ["Once upon a time", "The sea"]
    whole = client.completions.create(model=MODEL_NAME, prompt=prompts, max_tokens=6, temperature=0)
    assert [c.index for c in whole.choices] == [0, 1]
    singles = [
        client.completions.create(model=MODEL_NAME, prompt=p, max_tokens=6, temperature=0)
        for p in prompts
    ]
    assert [c.text for c in whole.choices] == [s.choices[0].text for s in singles]
    assert whole.usage is not None
    assert whole.usage.completion_tokens == sum(
        s.usage.completion_tokens for s in singles if s.usage is not None
    )
    stream = client.completions.create(
        model=MODEL_NAME,
        prompt=prompts,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts = ["", ""]
    finished: set[int] = set()
    usage = None
    for chunk in stream:
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            if choice.finish_reason is not None:
                finished.add(choice.index)
        usage = chunk.usage or usage
    assert texts == [c.text for c in whole.choices]
    assert finished == {0, 1}
    assert usage == whole.usage


def test_role_is_only_in_the_first_delta(http: httpx.Client) -> None:
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 6, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        data = sse_data(response)
    assert data[-1] == "[DONE]"
    deltas = [json.loads(item)["choices"][0]["delta"] for item in data[:-1]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all("role" not in delta for delta in deltas[1:])
    assert deltas[-1] == {}


def test_every_response_has_a_request_id_and_echoes_the_clients(
    client: openai.OpenAI, http: httpx.Client
) -> None:
    completion = client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,
        max_tokens=2,  # type: ignore[arg-type]
    )
    assert completion._request_id  # type: ignore[attr-defined]
    for method, path in (("GET", "/v1/models"), ("GET", "/nothing"), ("GET", "/healthz")):
        response = http.request(method, path, headers={"x-request-id": "req-abc.123"})
        assert response.headers["x-request-id"] == "req-abc.123"
    unusable = http.get("/healthz", headers={"x-request-id": "a b\tc"})
    assert unusable.headers["x-request-id"] not in ("", "a b\tc")


def test_resuming_a_finished_jobs_events_at_its_last_seq_ends_at_once(
    http: httpx.Client,
) -> None:
    body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 4}
    job_id = http.post("/v1/jobs", json=body).json()["id"]
    eventually(
        lambda: http.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded",
        timeout_s=60,
        what="the job finishes",
    )
    with http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
        ids = [int(line[4:]) for line in response.iter_lines() if line.startswith("id: ")]
    last = ids[-1]
    for resume_at in (last, last + 5):
        # A hanging stream would exceed the one-second read timeout.
        response = http.get(
            f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": str(resume_at)}, timeout=1.0
        )
        assert response.status_code == 204
    with http.stream(
        "GET", f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": str(last - 1)}
    ) as response:
        assert response.status_code == 200
        assert [json.loads(d)["type"] for d in sse_data(response)] == ["done"]


def greedy_reply(client: openai.OpenAI, **controls: object) -> openai.types.chat.ChatCompletion:
    fields: dict[str, object] = {"max_tokens": 24, "temperature": 0, **controls}
    return client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,  # type: ignore[arg-type]
        **fields,  # type: ignore[arg-type]
    )


def test_penalties_change_the_greedy_reply(client: openai.OpenAI) -> None:
    plain = greedy_reply(client).choices[0].message.content
    assert greedy_reply(client).choices[0].message.content == plain, "greedy is repeatable"
    # (vLLM's `repetition_penalty` is checked on the engine: at its bound of 2 it does not
    # break this prompt's loop, whose logit leads by more than a factor of 2.)
    for controls in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0}):
        assert greedy_reply(client, **controls).choices[0].message.content != plain, controls


def test_logit_bias_bans_the_tokens_of_the_greedy_reply(
    client: openai.OpenAI, tiny_model_dir: Path
) -> None:
    plain = greedy_reply(client).choices[0].message.content
    assert plain
    tokenizer = Tokenizer.from_file(str(tiny_model_dir / "tokenizer.json"))
    ids = set(tokenizer.encode(plain, add_special_tokens=False).ids)
    biased = greedy_reply(client, logit_bias={str(i): -100 for i in ids})
    assert biased.choices[0].message.content != plain
    with pytest.raises(openai.BadRequestError, match="vocabulary"):
        greedy_reply(client, logit_bias={"99999999": -100})
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        greedy_reply(client, logit_bias={"5": -101})


def test_ignore_eos_generates_exactly_max_tokens(client: openai.OpenAI) -> None:
    reply = greedy_reply(client, max_tokens=40, extra_body={"ignore_eos": True})
    assert reply.usage is not None and reply.usage.completion_tokens == 40
    assert reply.choices[0].finish_reason == "length"


def test_chat_logprobs_stream_and_not_come_from_the_raw_distribution(
    client: openai.OpenAI,
) -> None:
    fields = {"max_tokens": 12, "logprobs": True, "top_logprobs": 3}
    fields["extra_body"] = {"ignore_eos": True}
    whole = greedy_reply(client, **fields)
    content = whole.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and whole.usage is not None
    assert len(content) == whole.usage.completion_tokens == 12
    for entry in content:
        assert entry.logprob <= 0 and entry.bytes is not None
        assert len(entry.top_logprobs) == 3
        ranked = [t.logprob for t in entry.top_logprobs]
        assert ranked == sorted(ranked, reverse=True)
        # Greedy, no penalties: the token picked is the raw distribution's likeliest.
        assert entry.token == entry.top_logprobs[0].token
        assert entry.logprob == pytest.approx(ranked[0])
    streamed = []
    for chunk in client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,  # type: ignore[arg-type]
        temperature=0,
        stream=True,
        **fields,  # type: ignore[arg-type]
    ):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content or []
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    assert greedy_reply(client).choices[0].logprobs is None


def test_completion_logprobs_stream_and_not(client: openai.OpenAI) -> None:
    fields = {"model": MODEL_NAME, "prompt": "The sea", "max_tokens": 8, "temperature": 0}
    fields |= {"logprobs": 2, "extra_body": {"ignore_eos": True}}
    whole = client.completions.create(**fields)  # type: ignore[call-overload]
    logprobs = whole.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert len(logprobs.tokens) == 8 == len(logprobs.token_logprobs or [])
    assert all(len(top) <= 2 for top in logprobs.top_logprobs or [])
    assert logprobs.text_offset is not None and logprobs.text_offset[0] == 0
    tokens: list[str] = []
    for chunk in client.completions.create(**fields, stream=True):  # type: ignore[call-overload]
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens or []
    assert tokens == logprobs.tokens


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    confident: bool
    score: int = Field(ge=0, le=10)
    reason: str = Field(max_length=12)


def test_parse_with_a_pydantic_model_gets_a_valid_object_from_random_weights(
    client: openai.OpenAI,
) -> None:
    for seed in range(3):
        completion = client.chat.completions.parse(
            model=MODEL_NAME,
            messages=MESSAGES,  # type: ignore[arg-type]
            response_format=Verdict,
            temperature=1.2,
            seed=seed,
            max_tokens=200,
        )
        choice = completion.choices[0]
        assert isinstance(choice.message.parsed, Verdict), choice.message.content
        assert choice.finish_reason == "stop"


def test_a_streamed_json_schema_reply_is_valid_json_and_json_object_too(
    client: openai.OpenAI,
) -> None:
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "verdict", "schema": Verdict.model_json_schema(), "strict": True},
    }
    text = ""
    for chunk in client.chat.completions.create(
        model=MODEL_NAME,
        messages=MESSAGES,  # type: ignore[arg-type]
        response_format=response_format,  # type: ignore[arg-type]
        temperature=1.2,
        seed=5,
        max_tokens=200,
        stream=True,
    ):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    Verdict.model_validate_json(text)
    with pytest.raises(openai.BadRequestError, match="ignore_eos"):
        greedy_reply(
            client, response_format={"type": "json_object"}, extra_body={"ignore_eos": True}
        )
