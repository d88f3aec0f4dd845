"""A recording HTTP proxy, for driving an unchanged client (an agent CLI) against a tokenrelay
cluster and showing what it sent and what came back: each POST is forwarded to the API, its
reply streamed back as it arrives, and both kept."""

from __future__ import annotations

import contextlib
import json
import subprocess
import tempfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from tokenrelay.cli.embedded_redis import EmbeddedRedis, free_port
from tokenrelay.cli.harness import ProcessGroup, tokenrelay_env

_HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


def recording_proxy(upstream: str, exchanges: list[dict[str, Any]]) -> ThreadingHTTPServer:
    """A server on a free local port that forwards each POST to `upstream` and appends
    `{path, headers, body, status, no_effect, reply}` to `exchanges`; `shutdown()` it."""

    class Forward(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length", "0")))
            headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_HEADERS}
            record: dict[str, Any] = {
                "path": self.path,
                "headers": headers,
                "body": json.loads(body) if body else None,
            }
            exchanges.append(record)
            with (
                httpx.Client(timeout=None) as client,
                client.stream("POST", upstream + self.path, content=body, headers=headers) as up,
            ):
                record["status"] = up.status_code
                record["no_effect"] = up.headers.get("x-tokenrelay-no-effect")
                record["reply"] = ""
                self.send_response(up.status_code)
                for name, value in up.headers.items():
                    if name.lower() not in _HOP_HEADERS:
                        self.send_header(name, value)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                try:
                    for chunk in up.iter_raw():
                        record["reply"] += chunk.decode(errors="replace")
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        self.wfile.flush()
                    self.wfile.write(b"0\r\n\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    record["client_left"] = True

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Forward)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@contextlib.contextmanager
def serving(model_dir: Path, log_dir: Path, model: str) -> Iterator[str]:
    """Redis, one worker and one API process serving `model_dir` as `model`; yields the
    API's URL."""
    with EmbeddedRedis() as redis_server, ProcessGroup(log_dir=log_dir) as group:
        env = tokenrelay_env(redis_server.url, str(model_dir), model)
        group.start_worker(redis_server.url, env=env)
        port = free_port()
        group.start_api(port, env=env)
        yield f"http://127.0.0.1:{port}"


def record_run(
    model_dir: Path, model: str, run: Callable[[str], tuple[int, str]]
) -> tuple[list[dict[str, Any]], int, str]:
    """Serve `model_dir` behind a recording proxy and call `run` with the proxy's URL (it
    runs the client and returns its exit code and output); returns the exchanges the proxy
    recorded, the exit code and the output."""
    exchanges: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="recorded-run-logs-") as logs,
        serving(model_dir, Path(logs), model) as api_url,
    ):
        proxy = recording_proxy(api_url, exchanges)
        try:
            code, output = run(f"http://127.0.0.1:{proxy.server_address[1]}")
        finally:
            proxy.shutdown()
    return exchanges, code, output


def sse_event_names(record: dict[str, Any]) -> list[str]:
    """The `event:` names of a recorded reply, in order."""
    return [
        line.removeprefix("event: ")
        for line in record.get("reply", "").splitlines()
        if line.startswith("event: ")
    ]


def run_client(
    command: list[str], env: dict[str, str], cwd: str, timeout_s: float
) -> tuple[int, str]:
    """Run an agent CLI to its end, stdin closed, bounded by `timeout_s`: its exit status and
    its output (124 and a line saying so when it ran out of time)."""
    try:
        done = subprocess.run(
            command,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout_s,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return 124, f"{Path(command[0]).name} did not finish within {timeout_s:g} s"
    return done.returncode, (done.stdout + done.stderr).decode(errors="replace")
