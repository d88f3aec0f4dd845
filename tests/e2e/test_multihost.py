"""A real multi-host smoke test: Redis, an API process and a worker in three network
namespaces joined by veth pairs on private addresses; then the worker's link is cut.

    root (test client) 10.77.3.1 ── 10.77.3.2 api-ns 10.77.1.2 ── 10.77.1.1 redis-ns
                                                                  10.77.2.1 ── 10.77.2.2 worker-ns

Needs root and iproute2 (`ip netns`); skipped with the reason where namespaces cannot be made.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.support.cluster import MODEL_NAME
from tokenrelay.cli.embedded_redis import find_redis_server
from tokenrelay.cli.harness import Child, ProcessGroup, tokenrelay_command
from tokenrelay.testing.polling import eventually

LEASE_TTL_S = 2
STARTUP_TIMEOUT_S = 60.0
API = "10.77.3.2"


@dataclass
class Hosts:
    suffix: str
    log_dir: Path
    group: ProcessGroup = field(init=False)

    def __post_init__(self) -> None:
        self.group = ProcessGroup(log_dir=self.log_dir)

    def ns(self, role: str) -> str:
        return f"tr-{role}-{self.suffix}"

    def veth(self, link: str, side: str) -> str:
        return f"v{link}{side}{self.suffix}"[:15]

    def spawn(self, role: str, command: list[str], env: dict[str, str]) -> Child:
        return self.group.spawn(role, ["ip", "netns", "exec", self.ns(role), *command], env)


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def _link(hosts: Hosts, name: str, left: str | None, right: str, subnet: str) -> None:
    """A veth pair: `<subnet>.1` on the left namespace (None: the root), `.2` on the right."""
    a, b = hosts.veth(name, "a"), hosts.veth(name, "b")
    ip("link", "add", a, "type", "veth", "peer", "name", b)
    for dev, ns, host in ((a, left, 1), (b, right, 2)):
        prefix = [] if ns is None else ["-n", hosts.ns(ns)]
        if ns is not None:
            ip("link", "set", dev, "netns", hosts.ns(ns))
        ip(*prefix, "addr", "add", f"{subnet}.{host}/24", "dev", dev)
        ip(*prefix, "link", "set", dev, "up")


@pytest.fixture
def hosts(tmp_path: Path) -> Iterator[Hosts]:
    if shutil.which("ip") is None or os.geteuid() != 0:
        pytest.skip("needs root and iproute2 to create network namespaces")
    hosts = Hosts(suffix=str(os.getpid() % 100000), log_dir=tmp_path)
    roles = ("redis", "api", "worker")
    try:
        for role in roles:
            ip("netns", "add", hosts.ns(role))
            ip("-n", hosts.ns(role), "link", "set", "lo", "up")
    except (subprocess.CalledProcessError, OSError) as exc:
        for role in roles:
            subprocess.run(["ip", "netns", "del", hosts.ns(role)], capture_output=True)
        pytest.skip(f"cannot create network namespaces here: {exc}")
    try:
        _link(hosts, "r", "redis", "api", "10.77.1")
        _link(hosts, "w", "redis", "worker", "10.77.2")
        _link(hosts, "c", None, "api", "10.77.3")
        yield hosts
    finally:
        for child in hosts.group.children:
            child.kill()
        hosts.group.stop()
        for role in roles:
            subprocess.run(["ip", "netns", "del", hosts.ns(role)], capture_output=True)
        subprocess.run(["ip", "link", "del", hosts.veth("c", "a")], capture_output=True)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """`eventually`, counting an HTTP error as not yet."""

    def holds() -> bool:
        try:
            return condition()
        except httpx.HTTPError:
            return False

    eventually(holds, STARTUP_TIMEOUT_S, what)


def test_stream_across_three_hosts_then_the_worker_link_is_cut(
    hosts: Hosts, tiny_model_dir: Path
) -> None:
    redis_cmd = [find_redis_server(), "--port", "6379", "--bind", "10.77.1.1", "10.77.2.1"]
    redis_cmd += ["--protected-mode", "no", "--save", "", "--appendonly", "no"]
    hosts.spawn("redis", redis_cmd, dict(os.environ))
    base = dict(
        os.environ,
        TOKENRELAY_MODEL=str(tiny_model_dir),
        TOKENRELAY_SERVED_MODEL_NAME=MODEL_NAME,
        TOKENRELAY_LEASE_TTL_S=str(LEASE_TTL_S),
        # One attempt: with no other worker, a continuation would wait out its queue wait;
        # this test is about how fast a cut link ends the stream (continuations:
        # test_continuation.py).
        TOKENRELAY_JOB_MAX_ATTEMPTS="1",
        HF_HUB_OFFLINE="1",
    )
    api_env = base | {"TOKENRELAY_REDIS_URL": "redis://10.77.1.1:6379/0"}
    worker_env = base | {"TOKENRELAY_REDIS_URL": "redis://10.77.2.1:6379/0"}
    hosts.spawn("api", tokenrelay_command("api", "--host", API, "--port", "8000"), api_env)
    hosts.spawn("worker", tokenrelay_command("worker"), worker_env)
    with httpx.Client(base_url=f"http://{API}:8000", timeout=30) as http:
        wait_until(lambda: http.get("/readyz").status_code == 200, "the API to reach Redis")
        wait_until(
            lambda: [m["id"] for m in http.get("/v1/models").json()["data"]] == [MODEL_NAME],
            "the worker to register across its link",
        )
        body = {
            "model": MODEL_NAME,
            "messages": [{"role": "user", "content": "across hosts"}],
            "max_tokens": 1800,
            "min_tokens": 1800,
            "stream": True,
        }
        with http.stream("POST", "/v1/chat/completions", json=body) as stream:
            lines = (line for line in stream.iter_lines() if line.startswith("data: "))
            first = json.loads(next(lines)[6:])
            job_id = first["id"].removeprefix("chatcmpl-")
            text = ""
            while not text:
                text = json.loads(next(lines)[6:])["choices"][0]["delta"].get("content") or ""
            ip("-n", hosts.ns("redis"), "link", "set", hosts.veth("w", "a"), "down")
            cut_at = time.monotonic()
            rest = list(lines)
        detected_s = time.monotonic() - cut_at
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["error"]["code"] == "worker_lost"
        assert detected_s <= LEASE_TTL_S + 3
        record = http.get(f"/v1/jobs/{job_id}").json()
        assert record["status"] == "failed" and record["error"]["type"] == "worker_lost"
        assert record["text"].startswith(text)
