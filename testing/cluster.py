"""A real Redis Cluster on local ports, for the token-plane tests and benchmarks: `primaries`
`cluster-enabled` `redis-server` children (`EmbeddedRedis`, append-only file on), no
replicas, the 16384 slots split evenly between them (`CLUSTER ADDSLOTSRANGE`), joined with
`CLUSTER MEET`, ready once every node reports `cluster_state:ok`. `redis-cli --cluster
create` does the same but refuses fewer than three primaries; a benchmark compares one
shard with two.
"""

from __future__ import annotations

import contextlib
import functools
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import redis

from tokenrelay.cli.embedded_redis import EmbeddedRedis, free_port
from tokenrelay.testing.polling import eventually

SLOTS = 16384
READY_TIMEOUT_S = 30.0
_BUS_PORT_OFFSET = 10_000
"""A cluster node also listens on its port + 10000 (the cluster bus)."""


@dataclass(frozen=True)
class EmbeddedCluster:
    """The started cluster: its primaries, and `url`, any node's (a client finds the rest)."""

    nodes: tuple[EmbeddedRedis, ...]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.nodes[0].port}"

    def node_holding(self, key: str) -> int:
        """The port of the primary that holds `key` (0 when none does): asked of each node
        directly, so the others answer MOVED."""
        for node in self.nodes:
            with (
                redis.Redis(port=node.port) as client,
                contextlib.suppress(redis.exceptions.MovedError),
            ):
                if client.exists(key):
                    return node.port
        return 0


def _cluster_port() -> int:
    """A free port whose cluster bus port is a port too, and free now."""
    while True:
        port = free_port()
        if port + _BUS_PORT_OFFSET > 65_535:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port + _BUS_PORT_OFFSET))
            except OSError:
                continue
        return port


def _cluster_ok(port: int) -> bool:
    with redis.Redis(port=port, decode_responses=True) as client:
        info = client.execute_command("CLUSTER INFO")  # parsed into a dict by redis-py
        return bool(info.get("cluster_state") == "ok")


@contextmanager
def embedded_cluster(primaries: int = 3) -> Iterator[EmbeddedCluster]:
    with ExitStack() as stack:
        nodes = tuple(
            stack.enter_context(
                EmbeddedRedis(
                    _cluster_port(), persistent=True, extra_args=("--cluster-enabled", "yes")
                )
            )
            for _ in range(primaries)
        )
        for index, node in enumerate(nodes):
            first, last = SLOTS * index // primaries, SLOTS * (index + 1) // primaries - 1
            with redis.Redis(port=node.port) as client:
                client.execute_command("CLUSTER ADDSLOTSRANGE", first, last)
                for other in nodes[index + 1 :]:
                    client.execute_command("CLUSTER MEET", "127.0.0.1", other.port)
        for port in (node.port for node in nodes):
            ready = f"cluster_state:ok on port {port}"
            eventually(functools.partial(_cluster_ok, port), READY_TIMEOUT_S, ready)
        yield EmbeddedCluster(nodes)
