"""The HTTP client at the bottom of the `tokenrelay` client commands: every call to the API,
its failures (the API's `error_type` and message, or the network's) as one `ClientError`
line, and server-sent events read as their `data`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import IO, Any

import httpx

CONNECT_TIMEOUT_S = 5.0
POLL_HEADER = "X-Tokenrelay-Poll"
"""Marks a periodic refresh, which the API logs at DEBUG (`api/middleware/request_log.py`)."""
READ_TIMEOUT_S = 60.0  # streams get a ping every TOKENRELAY_SSE_PING_S (15 s by default)


class ClientError(Exception):
    """A failure to report as one line."""


class Client:
    """A small synchronous client of the tokenrelay HTTP API."""

    def __init__(self, base_url: str, api_key: str | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self._http = httpx.Client(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S),
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._http.close()

    def models(self) -> list[str]:
        return [str(model["id"]) for model in self._json("GET", "/v1/models")["data"]]

    def chat_stream(self, body: dict[str, Any]) -> Iterator[str]:
        """The text deltas of a streamed chat completion; raises `ClientError` on an error."""
        try:
            with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
                if response.status_code >= 400:
                    response.read()
                    raise ClientError(_describe(response))
                for data in _sse_data(response.iter_lines()):
                    if data == "[DONE]":
                        return
                    try:
                        chunk = json.loads(data)
                    except ValueError as exc:
                        raise ClientError(f"malformed stream event: {data[:80]!r}") from exc
                    if "error" in chunk:
                        raise ClientError(_error_line(chunk))
                    for choice in chunk.get("choices") or ():
                        if text := (choice.get("delta") or {}).get("content"):
                            yield text
        except httpx.HTTPError as exc:
            raise ClientError(self._transport_error(exc)) from exc
        raise ClientError("the stream ended without `[DONE]`: the connection was cut")

    def submit(self, body: dict[str, Any]) -> dict[str, Any]:
        return self._json("POST", "/v1/jobs", json=body)

    def job(self, job_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/jobs/{job_id}")

    def cancel(self, job_id: str) -> dict[str, Any]:
        return self._json("DELETE", f"/v1/jobs/{job_id}")

    def cluster(self, limit: int = 10) -> dict[str, Any]:
        params, headers = {"limit": limit}, {POLL_HEADER: "1"}
        return self._json("GET", "/v1/cluster", params=params, headers=headers)

    def upload_file(self, name: str, content: IO[bytes]) -> dict[str, Any]:
        files = {"file": (name, content, "application/jsonl")}
        return self._json("POST", "/v1/files", data={"purpose": "batch"}, files=files)

    def file_content(self, file_id: str) -> bytes:
        try:
            response = self._http.get(f"/v1/files/{file_id}/content")
        except httpx.HTTPError as exc:
            raise ClientError(self._transport_error(exc)) from exc
        if response.status_code >= 400:
            raise ClientError(_describe(response))
        return response.content

    def create_batch(
        self,
        file_id: str,
        endpoint: str,
        metadata: dict[str, str] | None,
        webhook: str | None = None,
    ) -> dict[str, Any]:
        body = {"input_file_id": file_id, "endpoint": endpoint, "completion_window": "24h"}
        if webhook is not None:
            body["webhook"] = webhook
        return self._json("POST", "/v1/batches", json={**body, "metadata": metadata})

    def batch(self, batch_id: str) -> dict[str, Any]:
        return self._json("GET", f"/v1/batches/{batch_id}")

    def cancel_batch(self, batch_id: str) -> dict[str, Any]:
        return self._json("POST", f"/v1/batches/{batch_id}/cancel")

    def _json(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise ClientError(self._transport_error(exc)) from exc
        if response.status_code >= 400:
            raise ClientError(_describe(response))
        try:
            return response.json()
        except ValueError as exc:
            raise ClientError(f"{method} {path}: the answer is not JSON") from exc

    def _transport_error(self, exc: httpx.HTTPError) -> str:
        if isinstance(exc, httpx.TimeoutException):
            return f"{self.base_url} did not answer in time ({type(exc).__name__})"
        return f"cannot reach {self.base_url}: {exc or type(exc).__name__}"


def _sse_data(lines: Iterator[str]) -> Iterator[str]:
    """The `data` of each server-sent event (multi-line data joined with `\\n`)."""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
        elif line.startswith("data:"):
            data.append(line[5:].removeprefix(" "))
    if data:
        yield "\n".join(data)


def _describe(response: httpx.Response) -> str:
    try:
        return _error_line(response.json()) + f" (HTTP {response.status_code})"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {response.status_code}: {response.text[:200]}"


def _error_line(body: dict[str, Any]) -> str:
    """`code: message` from the OpenAI error shape."""
    error = body["error"]
    return f"{error.get('code') or error.get('type')}: {error['message']}"
