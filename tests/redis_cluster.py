"""A real Redis Cluster for the token-plane tests: three primaries on free local ports, each
a `cluster-enabled` `redis-server` with its append-only file on, joined by
`redis-cli --cluster create` (no replicas), ready once every node reports `cluster_state:ok`.
Ports are picked below 55536, so that each node's cluster bus port (+10000) exists.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import redis

from tokenrelay.cli.embedded_redis import EmbeddedRedis, free_port
from tokenrelay.cli.harness import eventually

READY_TIMEOUT_S = 30.0
_BUS_PORT_OFFSET = 10_000
"""A cluster node also listens on its port + 10000 (the cluster bus)."""


def _cluster_port() -> int:
    """A free port whose cluster bus port is a port too (and free now)."""
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


@dataclass(frozen=True)
class RedisCluster:
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


def _cluster_ok(port: int) -> bool:
    with redis.Redis(port=port, decode_responses=True) as client:
        info = client.execute_command("CLUSTER INFO")  # parsed into a dict by redis-py
        return bool(info.get("cluster_state") == "ok")


@contextmanager
def redis_cluster(primaries: int = 3) -> Iterator[RedisCluster]:
    redis_cli = shutil.which("redis-cli")
    if redis_cli is None:
        raise FileNotFoundError("redis-cli is needed to create a Redis Cluster")
    with ExitStack() as stack:
        nodes = tuple(
            stack.enter_context(
                EmbeddedRedis(
                    _cluster_port(), persistent=True, extra_args=("--cluster-enabled", "yes")
                )
            )
            for _ in range(primaries)
        )
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        create = ["--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"]
        subprocess.run(
            [redis_cli, *create],
            check=True,
            capture_output=True,
            timeout=READY_TIMEOUT_S,
        )
        for node in nodes:
            ready = f"cluster_state:ok on port {node.port}"
            eventually(lambda port=node.port: _cluster_ok(port), READY_TIMEOUT_S, ready)
        yield RedisCluster(nodes)
