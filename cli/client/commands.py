"""The client side of the `tokenrelay` command: `chat`, `submit`, `status`, `cancel`, `top`,
`batch` (`tokenrelay.cli.client.batch`).

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
import time
from collections.abc import Callable
from typing import Any

from tokenrelay.cli.client.http import Client, ClientError

DEFAULT_URL = "http://127.0.0.1:8000"
URL_ENV = "TOKENRELAY_URL"
API_KEY_ENV = "TOKENRELAY_API_KEY"
EXIT_FAILURE = 1
EXIT_INTERRUPTED = 130
TERMINAL_STATUSES = frozenset({"succeeded", "failed", "cancelled", "expired"})
CANCEL_WAIT_S = 30.0
"""How long `cancel` waits for a running job to stop (at its next decoding step)."""
CANCEL_POLL_S = 0.2


def _request_body(client: Client, args: argparse.Namespace, *, stream: bool) -> dict[str, Any]:
    messages = [{"role": "system", "content": args.system}] if args.system else []
    messages.append({"role": "user", "content": args.question})
    body: dict[str, Any] = {"model": args.model or _only_model(client), "messages": messages}
    for field in ("max_tokens", "temperature", "seed"):
        if (value := getattr(args, field)) is not None:
            body[field] = value
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
    """Cancel, then wait for the job's end: a running job stops at its next decoding step,
    or may finish first. Prints the status it ended with."""
    record = client.cancel(args.job_id)
    deadline = time.monotonic() + CANCEL_WAIT_S
    while record["status"] not in TERMINAL_STATUSES:
        if time.monotonic() > deadline:
            raise ClientError(
                f"{args.job_id} is still {record['status']} {CANCEL_WAIT_S:g} s after it was "
                "asked to stop"
            )
        time.sleep(CANCEL_POLL_S)  # the polling period, not a synchronisation
        record = client.job(args.job_id)
    ended = record["status"]
    print(f"{record['id']}: {ended}" + ("" if ended == "cancelled" else " (before the cancel)"))
    return 0


def _top(client: Client, args: argparse.Namespace) -> int:
    from tokenrelay.cli.client.top import run_top

    return run_top(client, interval_s=args.interval, once=args.once)


def _batch(client: Client, args: argparse.Namespace) -> int:
    from tokenrelay.cli.client.batch import run_batch

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
