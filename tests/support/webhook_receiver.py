"""Webhook test helpers shared by the modules that receive webhooks: a local receiver, the
Standard Webhooks check written independently of tokenrelay's code, and a wait until every
queued delivery is settled."""

from __future__ import annotations

import base64
import hashlib
import hmac
import http.server
import queue
import threading
import time
from dataclasses import dataclass

import redis

from tests.support.cluster import Cluster
from tokenrelay.shared.redis import keys
from tokenrelay.testing.polling import eventually

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
WAIT_S = 60.0


def independent_signature(secret: str, message_id: str, timestamp: str, body: bytes) -> str:
    """Standard Webhooks verification, written from the spec without tokenrelay's code."""
    key = base64.b64decode(secret.split("_", 1)[1])
    signed = message_id.encode() + b"." + timestamp.encode() + b"." + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def assert_signed(headers: dict[str, str], body: bytes, secret: str = SECRET) -> None:
    expected = independent_signature(
        secret, headers["webhook-id"], headers["webhook-timestamp"], body
    )
    assert hmac.compare_digest(headers["webhook-signature"], expected)
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 600


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes


class Receiver:
    """An HTTP server thread on 127.0.0.1 that records every POST; `fail[path]` requests to a
    path are answered 500 before it starts answering 204."""

    def __init__(self) -> None:
        self.received: queue.Queue[Received] = queue.Queue()
        self.fail: dict[str, int] = {}
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                receiver.received.put(Received(self.path, headers, body))
                failures = receiver.fail.get(self.path, 0)
                receiver.fail[self.path] = failures - 1
                self.send_response(500 if failures > 0 else 204)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def next(self, timeout_s: float = WAIT_S) -> Received:
        return self.received.get(timeout=timeout_s)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def nothing_left(sync_redis: redis.Redis) -> bool:
    """No webhook delivery is waiting, held by a dispatcher or scheduled for a retry."""
    processing = list(sync_redis.scan_iter(keys.webhook_processing("*")))
    lists = [keys.webhook_deliveries(), *processing]
    return sum(sync_redis.llen(k) for k in lists) + sync_redis.zcard(keys.webhook_retries()) == 0


def wait_until_settled(cluster: Cluster) -> None:
    """Every delivery queued so far is settled: none waiting, held or scheduled for retry."""
    client = redis.Redis.from_url(cluster.redis_url, decode_responses=True)
    try:
        eventually(lambda: nothing_left(client), WAIT_S, "webhook deliveries to settle")
    finally:
        client.close()
