"""`tokenrelay batch submit|status|download|cancel`: OpenAI batches from the terminal.

`submit` uploads a JSONL file (`purpose=batch`), creates the batch and prints its id; with
`--wait` it then shows a progress bar (rich, on stderr) until the batch ends. `status`
prints the batch (`--watch`: the progress bar until it ends, `--json`: the object);
`download` writes the output file (and, with `--errors`, the error file: exit status 1 when
the batch has none); `cancel` asks the batch to stop. A batch that ends other than
`completed` is exit status 1 for `--wait`.
rich and httpx (the `client` extra) are loaded only when a command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tokenrelay.cli.client.http import Client

TERMINAL_STATUSES = frozenset({"completed", "failed", "expired", "cancelled"})
EXIT_NOT_COMPLETED = 1


def add_batch_commands(batch: argparse.ArgumentParser, connection: argparse.ArgumentParser) -> None:
    """The `batch` subcommands, each with the client's connection options."""
    commands = batch.add_subparsers(required=True, metavar="BATCH_COMMAND", dest="batch_command")
    submit = commands.add_parser("submit", parents=[connection], help="upload a file, start it")
    submit.add_argument("file", type=Path, help="JSONL, one request per line (OpenAI's format)")
    submit.add_argument("--endpoint", default="/v1/chat/completions")
    submit.add_argument("--metadata", action="append", default=[], metavar="KEY=VALUE")
    submit.add_argument("--webhook", metavar="URL", help="POST the batch here when it ends")
    submit.add_argument("--wait", action="store_true", help="show progress until it ends")
    status = commands.add_parser("status", parents=[connection], help="print a batch")
    status.add_argument("batch_id")
    status.add_argument("--json", action="store_true", help="the batch object as JSON")
    status.add_argument("--watch", action="store_true", help="show progress until it ends")
    download = commands.add_parser("download", parents=[connection], help="its results")
    download.add_argument("batch_id")
    download.add_argument("--output", type=Path, help="default: stdout")
    download.add_argument("--errors", type=Path, help="also write the error file here")
    cancel = commands.add_parser("cancel", parents=[connection], help="stop a batch")
    cancel.add_argument("batch_id")
    for sub in (submit, status):
        sub.add_argument("--interval", type=float, default=1.0, help="seconds between polls")


def run_batch(client: Client, args: argparse.Namespace) -> int:
    command = args.batch_command
    if command == "submit":
        return _submit(client, args)
    if command == "status":
        return _status(client, args)
    if command == "download":
        return _download(client, args)
    batch = client.cancel_batch(args.batch_id)
    print(f"{batch['id']}: {batch['status']}")
    return 0


def _submit(client: Client, args: argparse.Namespace) -> int:
    from tokenrelay.cli.client.http import ClientError

    metadata = dict(item.partition("=")[::2] for item in args.metadata)
    try:
        with args.file.open("rb") as content:
            uploaded = client.upload_file(args.file.name, content)
    except OSError as exc:
        raise ClientError(f"cannot read {args.file}: {exc.strerror}") from exc
    batch = client.create_batch(uploaded["id"], args.endpoint, metadata or None, args.webhook)
    print(batch["id"], flush=True)
    return _watch(client, batch["id"], args.interval) if args.wait else 0


def _status(client: Client, args: argparse.Namespace) -> int:
    if args.watch:
        return _watch(client, args.batch_id, args.interval)
    batch = client.batch(args.batch_id)
    print(json.dumps(batch, indent=2) if args.json else format_batch(batch))
    return 0


def _download(client: Client, args: argparse.Namespace) -> int:
    from tokenrelay.cli.client.http import ClientError

    batch = client.batch(args.batch_id)
    if not batch.get("output_file_id") and not batch.get("error_file_id"):
        raise ClientError(f"batch {batch['id']} has no results yet (status {batch['status']})")
    if output_id := batch.get("output_file_id"):
        _write(client.file_content(output_id), args.output)
    if args.errors is None:
        return 0
    if not (error_id := batch.get("error_file_id")):
        counts = batch["request_counts"]
        raise ClientError(
            f"batch {batch['id']} has no error file: {counts['failed']} of its "
            f"{counts['total']} requests failed (status {batch['status']}); "
            f"{args.errors} not written"
        )
    _write(client.file_content(error_id), args.errors)
    return 0


def _write(content: bytes, path: Path | None) -> None:
    if path is None:
        sys.stdout.buffer.write(content)
        sys.stdout.flush()
    else:
        path.write_bytes(content)


def _watch(client: Client, batch_id: str, interval_s: float) -> int:
    """A progress bar of the batch's finished lines until it ends; its exit status."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[failed]} failed"),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=Console(stderr=True)) as progress:
        task = progress.add_task(batch_id, total=None, failed=0)
        while True:
            batch = client.batch(batch_id)
            counts = batch["request_counts"]
            progress.update(
                task,
                description=f"{batch_id} {batch['status']}",
                total=counts["total"] or None,
                completed=counts["completed"] + counts["failed"],
                failed=counts["failed"],
            )
            if batch["status"] in TERMINAL_STATUSES:
                break
            time.sleep(interval_s)  # the polling period, not a synchronisation
    print(format_batch(batch))
    return 0 if batch["status"] == "completed" else EXIT_NOT_COMPLETED


def format_batch(batch: dict[str, Any]) -> str:
    """A batch as `name: value` lines."""
    counts = batch["request_counts"]
    lines = [
        f"id: {batch['id']}",
        f"status: {batch['status']}",
        f"endpoint: {batch['endpoint']}",
        f"requests: {counts['completed']} completed, {counts['failed']} failed"
        f" of {counts['total']}",
    ]
    for field in ("output_file_id", "error_file_id"):
        if batch.get(field):
            lines.append(f"{field}: {batch[field]}")
    for error in (batch.get("errors") or {}).get("data") or []:
        where = f" (line {error['line']})" if error.get("line") is not None else ""
        lines.append(f"error: {error.get('code')}: {error.get('message')}{where}")
    return "\n".join(lines)
