"""The client side of the `tokenrelay` command: `chat`, `submit`, `status`, `cancel`, `top`,
`batch` (`tokenrelay.cli.batch_client`).

It talks to a tokenrelay API over HTTP like any other client: the URL comes from `--url`,
else `TOKENRELAY_URL`, else `http://127.0.0.1:8000`; the API key from `--api-key`, else
`TOKENRELAY_API_KEY` (sent as `Authorization: Bearer`). Every failure, from the API (its
`error_type` and message) or from the network, is one line on stderr and exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "TOKENRELAY_URL"
API_KEY_ENV = "TOKENRELAY_API_KEY"
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
CONNECT_TIMEOUT_S = 5.0
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
        return self._json("GET", "/v1/cluster", params={"limit": limit})

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


def _request_body(client: Client, args: argparse.Namespace, *, stream: bool) -> dict[str, Any]:
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.question})
    body: dict[str, Any] = {"model": args.model or _only_model(client), "messages": messages}
    if args.max_tokens is not None:
        body["max_tokens"] = args.max_tokens
    if stream:
        body["stream"] = True
    return body


def _only_model(client: Client) -> str:
    models = client.models()
    if len(models) != 1:
        served = ", ".join(models) or "none"
        raise ClientError(f"choose a model with --model (served: {served})")
    return models[0]


def _chat(client: Client, args: argparse.Namespace) -> int:
    at_line_start = True
    try:
        for text in client.chat_stream(_request_body(client, args, stream=True)):
            sys.stdout.write(text)
            sys.stdout.flush()
            at_line_start = text.endswith("\n")
    finally:
        if not at_line_start:
            sys.stdout.write("\n")
            sys.stdout.flush()
    return 0


def _submit(client: Client, args: argparse.Namespace) -> int:
    print(client.submit(_request_body(client, args, stream=False))["id"])
    return 0


def _status(client: Client, args: argparse.Namespace) -> int:
    record = client.job(args.job_id)
    print(json.dumps(record, indent=2, ensure_ascii=False) if args.json else format_record(record))
    return 0


def _cancel(client: Client, args: argparse.Namespace) -> int:
    record = client.cancel(args.job_id)
    print(f"{record['id']}: {record['status']}")
    return 0


def _top(client: Client, args: argparse.Namespace) -> int:
    from tokenrelay.cli.top import run_top

    return run_top(client, interval_s=args.interval, once=args.once)


def _batch(client: Client, args: argparse.Namespace) -> int:
    from tokenrelay.cli.batch_client import run_batch

    return run_batch(client, args)


def format_record(record: dict[str, Any]) -> str:
    """A job record as `name: value` lines, then its text."""
    lines = [f"id: {record['id']}", f"status: {record['status']}", f"model: {record['model']}"]
    if record.get("finish_reason"):
        lines.append(f"finish_reason: {record['finish_reason']}")
    if usage := record.get("usage"):
        lines.append(
            f"usage: {usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion"
            f" = {usage['total_tokens']} tokens"
        )
    if error := record.get("error"):
        lines.append(f"error: {error['type']}: {error['message']}")
    created, started, finished = (
        record.get(k) for k in ("created_at", "started_at", "finished_at")
    )
    if started is not None:
        lines.append(f"queue_wait_s: {started - created:.3f}")
        if finished is not None:
            lines.append(f"run_s: {finished - started:.3f}")
    lines.append("text:")
    lines.append(record.get("text") or "")
    return "\n".join(lines)


_COMMANDS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "chat": _chat,
    "submit": _submit,
    "status": _status,
    "cancel": _cancel,
    "top": _top,
    "batch": _batch,
}


def run(args: argparse.Namespace) -> int:
    """Run the client subcommand `args.client_command`; its exit status."""
    url = args.url or os.environ.get(URL_ENV) or DEFAULT_URL
    api_key = args.api_key or os.environ.get(API_KEY_ENV) or None
    try:
        with Client(url, api_key) as client:
            return _COMMANDS[args.client_command](client, args)
    except ClientError as exc:
        print(f"tokenrelay {args.client_command}: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
