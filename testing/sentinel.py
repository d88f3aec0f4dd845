"""A Sentinel-managed Redis on free local ports: a primary, a replica and three sentinels
(quorum 2), for tests and `bench.chaos`, from the same `redis-server` binary
(`redis-server <conf> --sentinel`).

`failover()` asks the sentinels to promote the replica now (`SENTINEL FAILOVER`), as they do
by themselves when the primary stops answering for `down_after_ms`.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

from tokenrelay.cli.embedded_redis import EmbeddedRedis, find_redis_server, free_port

SERVICE = "mymaster"
SENTINELS = 3
QUORUM = 2


class EmbeddedSentinel:
    """`with EmbeddedSentinel() as group:`; `group.sentinels` is the
    `TOKENRELAY_REDIS_SENTINELS` value, `group.primary_port()` asks them where the primary is."""

    def __init__(self, down_after_ms: int = 1000, failover_timeout_ms: int = 5000) -> None:
        self._binary = find_redis_server()
        self._dir = Path(tempfile.mkdtemp(prefix="tokenrelay-sentinel-"))
        self.servers = [EmbeddedRedis()]
        self.servers.append(
            EmbeddedRedis(extra_args=("--replicaof", "127.0.0.1", str(self.servers[0].port)))
        )
        self.sentinel_ports = [free_port() for _ in range(SENTINELS)]
        self._down_after_ms = down_after_ms
        self._failover_timeout_ms = failover_timeout_ms
        self._processes: list[subprocess.Popen[bytes]] = []

    @property
    def sentinels(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)

    @property
    def url(self) -> str:
        """A plain URL of the first primary (for what takes one; its database applies)."""
        return self.servers[0].url

    def start(self) -> None:
        for server in self.servers:
            server.start()
        self._processes = [self._start_sentinel(port) for port in self.sentinel_ports]
        self._wait(
            self._settled, state=lambda: {port: self._view(port) for port in self.sentinel_ports}
        )
        self._wait(lambda: self._replicated(self.servers[0].port))

    def _start_sentinel(self, port: int) -> subprocess.Popen[bytes]:
        conf = self._dir / f"sentinel-{port}.conf"
        conf.write_text(
            f"port {port}\nbind 127.0.0.1\ndir {self._dir}\n"
            f"sentinel monitor {SERVICE} 127.0.0.1 {self.servers[0].port} {QUORUM}\n"
            f"sentinel down-after-milliseconds {SERVICE} {self._down_after_ms}\n"
            f"sentinel failover-timeout {SERVICE} {self._failover_timeout_ms}\n"
        )
        return subprocess.Popen(
            [self._binary, str(conf), "--sentinel"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def _settled(self) -> bool:
        """Whether every sentinel knows the replica and the other sentinels. A sentinel that
        exited (its port, free when picked, was taken before it bound it: an outgoing
        connection's ephemeral port, say) starts again on another port."""
        for index, process in enumerate(self._processes):
            if process.poll() is not None:
                self.sentinel_ports[index] = free_port()
                self._processes[index] = self._start_sentinel(self.sentinel_ports[index])
        return all(self._view(port) == "settled" for port in self.sentinel_ports)

    def _sentinel(self, port: int) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, decode_responses=True)

    def _view(self, port: int) -> str:
        """What the sentinel on `port` knows: "settled" once it knows the replica and two
        other sentinels (else the counts, or the error, for the message of a group that
        did not settle)."""
        try:
            with self._sentinel(port) as client:
                state = client.sentinel_master(SERVICE)
                replicas, others = int(state["num-slaves"]), int(state["num-other-sentinels"])
        except (redis.RedisError, KeyError) as exc:
            return repr(exc)
        if replicas >= 1 and others >= 2:
            return "settled"
        return f"{replicas} replicas, {others} other sentinels"

    def primary_port(self) -> int:
        with self._sentinel(self.sentinel_ports[0]) as client:
            _, port = client.sentinel_get_master_addr_by_name(SERVICE)
            return int(port)

    def failover(self) -> int:
        """Promote the replica, once it replicates the primary (else the promotion would
        discard what the primary holds); returns the new primary's port once it takes
        writes."""
        old = self.primary_port()
        self._wait(lambda: self._replicated(old))
        with self._sentinel(self.sentinel_ports[0]) as client:
            client.sentinel_failover(SERVICE)
        return self.promoted(old)

    def promoted(self, old: int) -> int:
        """Wait until the sentinels name a primary other than `old` and it takes writes (as
        they do by themselves once `old` stops answering); returns its port."""
        self._wait(lambda: self.primary_port() != old and self._is_primary(self.primary_port()))
        return self.primary_port()

    def _replicated(self, port: int) -> bool:
        """Whether the primary on `port` has a replica online: one that completed its sync
        and follows its writes (a replica's link comes up a few seconds after it starts)."""

        def online(client: redis.Redis) -> bool:
            replica = client.info("replication").get("slave0")
            return isinstance(replica, dict) and replica.get("state") == "online"

        return _asks(port, online)

    def _is_primary(self, port: int) -> bool:
        return _asks(port, lambda client: client.execute_command("ROLE")[0] == b"master")

    @staticmethod
    def _wait(
        condition: Callable[[], bool],
        timeout_s: float = 30.0,
        state: Callable[[], object] | None = None,
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if time.monotonic() > deadline:
                seen = f": {state()}" if state else ""
                raise TimeoutError(f"the Sentinel group did not settle{seen}")
            time.sleep(0.05)

    def stop(self) -> None:
        for process in self._processes:
            process.kill()
            process.wait(timeout=10)
        self._processes.clear()
        for server in self.servers:
            server.stop()

    def __enter__(self) -> EmbeddedSentinel:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
        for server in self.servers:
            server.__exit__()
        shutil.rmtree(self._dir, ignore_errors=True)


def _asks(port: int, question: Callable[[redis.Redis], bool]) -> bool:
    """`question` put to the server on `port`; False when it cannot answer."""
    try:
        with redis.Redis(host="127.0.0.1", port=port, socket_timeout=1) as client:
            return bool(question(client))
    except redis.RedisError:
        return False
