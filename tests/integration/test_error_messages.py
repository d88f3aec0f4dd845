"""A refused request is told its cause in words: a body not sent as JSON names its
Content-Type, an empty body the fields the route requires, a missing field its name. In the
OpenAI error shape (Anthropic's under `/v1/messages`), in-process against a real Redis."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from tokenrelay.api.app import create_app
from tokenrelay.shared.settings import Settings

CHAT = "/v1/chat/completions"
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'


@pytest.fixture
def client(redis_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(redis_url=redis_url, served_model_name="m"))) as test:
        yield test


def openai_error(response: httpx.Response) -> dict[str, object]:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert isinstance(error, dict)
    return error


@pytest.mark.parametrize(
    ("content_type", "named"),
    [
        (None, "this request has no Content-Type"),
        ("application/x-www-form-urlencoded", "`Content-Type: application/x-www-form-urlencoded`"),
        ("text/plain", "`Content-Type: text/plain`"),
    ],
)
def test_a_json_body_sent_without_a_json_content_type_is_told_so(
    client: TestClient, content_type: str | None, named: str
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    error = openai_error(client.post(CHAT, content=BODY, headers=headers))
    message = str(error["message"])
    assert "must be JSON, sent with `Content-Type: application/json`" in message
    assert message.endswith(named)


def test_the_same_body_with_a_json_content_type_is_taken(client: TestClient) -> None:
    for content_type in ("application/json", "application/json; charset=utf-8"):
        response = client.post("/v1/jobs", content=BODY, headers={"content-type": content_type})
        assert response.status_code == 202, response.text


@pytest.mark.parametrize("content_type", [None, "application/json"])
def test_an_empty_body_names_the_fields_the_route_requires(
    client: TestClient, content_type: str | None
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    error = openai_error(client.post(CHAT, content=b"", headers=headers))
    assert error["message"] == "the request body is empty: `model` and `messages` are required"
    jobs = openai_error(client.post("/v1/jobs", content=b""))
    assert jobs["message"] == "the request body is empty: `model` and `messages` are required"
    article = openai_error(client.post("/chat", content=b""))
    assert article["message"] == "the request body is empty: `query` is required"


def test_a_missing_field_is_named_as_required(client: TestClient) -> None:
    error = openai_error(client.post(CHAT, json={"model": "m"}))
    assert (error["message"], error["param"]) == ("`messages` is required", "messages")
    error = openai_error(client.post(CHAT, json={}))
    assert (error["message"], error["param"]) == ("`model` is required", "model")


@pytest.mark.parametrize("body", [b"null", b"[1, 2]", b'"hi"'])
def test_json_that_is_not_an_object_is_told_so(client: TestClient, body: bytes) -> None:
    response = client.post(CHAT, content=body, headers={"content-type": "application/json"})
    assert openai_error(response)["message"] == "the request body must be a JSON object"


def test_the_anthropic_route_names_the_cause_in_its_own_shape(client: TestClient) -> None:
    response = client.post("/v1/messages", content=BODY, headers={"content-type": "text/plain"})
    assert response.status_code == 400
    body = response.json()
    assert body["type"] == "error"
    assert "`Content-Type: text/plain`" in body["error"]["message"]
