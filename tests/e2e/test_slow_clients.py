"""Slow and idle clients against a real `tokenrelay api`: slowloris connections (headers never
finished), silent ones, and a body that never arrives are closed at their deadline; past
`TOKENRELAY_API_MAX_CONNECTIONS` a request gets a 503; the API keeps answering meanwhile."""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.cluster import Cluster, ClusterFactory
from tokenrelay.testing.polling import eventually

SLOWLORIS = 300
SILENT = 100
DRIP_S = 0.3
TIMEOUT_S = 1.0


@pytest.fixture
def cluster(make_cluster: ClusterFactory) -> Cluster:
    settings = {
        "TOKENRELAY_API_HEADER_TIMEOUT_S": str(TIMEOUT_S),
        "TOKENRELAY_API_BODY_TIMEOUT_S": str(TIMEOUT_S),
    }
    return make_cluster(settings, workers=0)


def connect(cluster: Cluster) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", cluster.api_port), timeout=5)
    sock.setblocking(False)
    return sock


def closed_by_server(sock: socket.socket, received: dict[int, bytes]) -> bool:
    """Reads what is there; True once the server has closed (or reset) the connection."""
    try:
        while chunk := sock.recv(65536):
            received[sock.fileno()] = received.get(sock.fileno(), b"") + chunk
        return True
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    yield opened
    for sock in opened:
        sock.close()


def test_slowloris_and_silent_connections_are_closed_at_the_header_deadline(
    cluster: Cluster, sockets: list[socket.socket]
) -> None:
    slow = [connect(cluster) for _ in range(SLOWLORIS)]
    silent = [connect(cluster) for _ in range(SILENT)]
    sockets += slow + silent
    for sock in slow:
        sock.send(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
    received: dict[int, bytes] = {}
    open_ = set(slow + silent)
    started = time.monotonic()
    drips = 0
    while open_ and time.monotonic() - started < 10 * TIMEOUT_S:
        for sock in slow:  # a header line at a time, never the blank line that ends them
            if sock in open_:
                with contextlib.suppress(OSError):  # closed by the server meanwhile
                    sock.send(b"X-Slow: %d\r\n" % drips)
        drips += 1
        # Meanwhile the API answers others at once.
        assert httpx.get(f"{cluster.base_url}/healthz", timeout=5).status_code == 200
        time.sleep(DRIP_S)
        open_ = {sock for sock in open_ if not closed_by_server(sock, received)}
    assert not open_, f"{len(open_)} of {SLOWLORIS + SILENT} connections still open"
    assert drips >= 2  # closed while still sending: a deadline, not an idle timeout
    answers = [received.get(sock.fileno(), b"") for sock in slow + silent]
    assert all(answer.startswith(b"HTTP/1.1 408 ") for answer in answers)


def test_a_body_that_never_arrives_is_closed_at_the_body_deadline(
    cluster: Cluster, sockets: list[socket.socket]
) -> None:
    sock = connect(cluster)
    sockets.append(sock)
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 1000\r\n\r\n"
    )
    sock.send(head + b'{"model": ')
    received: dict[int, bytes] = {}
    eventually(lambda: closed_by_server(sock, received), 10 * TIMEOUT_S, "the connection to close")
    assert received[sock.fileno()].startswith(b"HTTP/1.1 408 ")
    assert httpx.get(f"{cluster.base_url}/healthz", timeout=5).status_code == 200


def test_a_request_past_the_connection_limit_gets_a_503(
    make_cluster: ClusterFactory, sockets: list[socket.socket]
) -> None:
    cluster = make_cluster({"TOKENRELAY_API_MAX_CONNECTIONS": "20"}, workers=0)
    sockets += [connect(cluster) for _ in range(20)]
    response = httpx.get(f"{cluster.base_url}/healthz", timeout=5)
    assert response.status_code == 503
    for sock in sockets:
        sock.close()
    eventually(
        lambda: httpx.get(f"{cluster.base_url}/healthz", timeout=5).status_code == 200,
        10,
        "the API to answer again once the connections are closed",
    )
