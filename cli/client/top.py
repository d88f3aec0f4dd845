"""`tokenrelay top`: the live cluster view (`GET /v1/cluster`) in the terminal, with rich.

In-flight jobs against the global limit, queue depths, workers (state, running jobs against
their capacity, heartbeat age) and the most recent jobs, refreshed every `--interval`
seconds until Ctrl-C; `--once` prints one snapshot and exits. With API keys configured,
`/v1/cluster` needs an admin key.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from tokenrelay.cli.client.http import Client

RECENT_JOBS_SHOWN = 10
PIPE_WIDTH = 160  # output that is not a terminal is not cut to 80 columns


def run_top(client: Client, *, interval_s: float, once: bool) -> int:
    from tokenrelay.cli.client.http import ClientError

    console = _console()
    if once:
        console.print(render(client.cluster(RECENT_JOBS_SHOWN)))
        return 0
    with Live(
        render(client.cluster(RECENT_JOBS_SHOWN)), console=console, auto_refresh=False
    ) as live:
        while True:
            time.sleep(interval_s)  # the polling period, not a synchronisation
            try:
                live.update(render(client.cluster(RECENT_JOBS_SHOWN)), refresh=True)
            except ClientError as exc:
                live.update(Text(f"{client.base_url}: {exc}", style="bold red"), refresh=True)


def _console() -> Console:
    if sys.stdout.isatty() or "COLUMNS" in os.environ:
        return Console()
    return Console(width=PIPE_WIDTH)


def render(view: dict[str, Any]) -> RenderableType:
    """One snapshot of `GET /v1/cluster` as a header line and three tables."""
    now = float(view.get("now") or time.time())
    header = Text.assemble(
        ("tokenrelay ", "bold"),
        f"model {view.get('model', '?')}   ",
        ("in flight ", "bold"),
        f"{view.get('in_flight', '?')}/{view.get('max_inflight', '?')}   ",
        ("rejections ", "bold"),
        _rejections(view.get("rejections") or {}),
    )
    return Group(header, _queues(view), _workers(view, now), _recent(view))


def _rejections(counts: dict[str, int]) -> str:
    return ", ".join(f"{kind} {count}" for kind, count in sorted(counts.items())) or "none"


def _queues(view: dict[str, Any]) -> Table:
    table = Table(title="queues", title_justify="left")
    table.add_column("queue")
    table.add_column("waiting", justify="right")
    for queue in view.get("queues") or ():
        table.add_row(str(queue["name"]), str(queue["queued"]))
    return table


def _workers(view: dict[str, Any], now: float) -> Table:
    workers = view.get("workers") or ()
    table = Table(title=f"workers: {len(workers)}", title_justify="left")
    for column in ("worker", "state", "running", "model", "heartbeat", "host:pid"):
        table.add_column(column, no_wrap=column == "worker")
    for worker in workers:
        beat = worker.get("last_heartbeat")
        capacity = worker.get("capacity")  # null until the worker registered
        table.add_row(
            str(worker["name"]),
            str(worker.get("state", "?")),
            f"{len(worker.get('running') or ())}/{capacity if capacity is not None else '?'}",
            str(worker.get("model", "?")),
            f"{now - beat:.0f}s ago" if beat is not None else "-",
            f"{worker.get('hostname') or '?'}:{worker.get('pid') or '?'}",
        )
    return table


def _recent(view: dict[str, Any]) -> Table:
    table = Table(title="recent jobs", title_justify="left")
    for column in ("job", "status", "queue wait", "run", "tokens", "tok/s", "error"):
        table.add_column(
            column, justify="left" if column in ("job", "status", "error") else "right"
        )
    for job in (view.get("recent_jobs") or ())[:RECENT_JOBS_SHOWN]:
        table.add_row(
            str(job["id"])[:12],
            str(job["status"]),
            _seconds(job.get("queue_wait_s")),
            _seconds(job.get("run_s")),
            str(job.get("completion_tokens") if job.get("completion_tokens") is not None else "-"),
            str(job.get("tokens_per_s") or "-"),
            str(job.get("error_type") or ""),
        )
    return table


def _seconds(value: float | None) -> str:
    return f"{value:.2f}s" if value is not None else "-"
