"""A recording HTTP proxy, for driving an unchanged client (an agent CLI) against a tokenrelay
cluster and showing what it sent and what came back: each POST is forwarded to the API, its
reply streamed back as it arrives, and both kept."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from tokenrelay.cli.embedded_redis import free_port

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
