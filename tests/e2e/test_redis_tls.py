"""The whole cluster over `rediss://` with a password: a redis-server that listens on TLS only,
with a certificate from a self-signed CA made here (openssl), and API and worker processes
that trust that CA through the URL (`?ssl_ca_certs=`)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis

from tests.support.cluster import MODEL_NAME, ClusterFactory
from tokenrelay.cli.embedded_redis import find_redis_server, free_port
from tokenrelay.testing.polling import eventually

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")

PASSWORD = "tls-test-password"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def make_certificates(directory: Path) -> None:
    """ca.crt (self-signed) and server.crt/server.key for 127.0.0.1, signed by it."""
    ca = "req -x509 -newkey rsa:2048 -nodes -days 1 -keyout ca.key -out ca.crt"
    openssl(*ca.split(), "-subj", "/CN=tokenrelay test CA", cwd=directory)
    request = "req -newkey rsa:2048 -nodes -keyout server.key -out server.csr"
    openssl(*request.split(), "-subj", "/CN=127.0.0.1", cwd=directory)
    (directory / "san.ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    sign = (
        "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 1 "
        "-extfile san.ext -out server.crt"
    )
    openssl(*sign.split(), cwd=directory)


@pytest.fixture
def tls_redis_url(tmp_path: Path) -> Iterator[str]:
    make_certificates(tmp_path)
    port = free_port()
    server = subprocess.Popen(
        [  # no plain-text listener at all (port 0), TLS with a password
            find_redis_server(),
            "--port",
            "0",
            "--tls-port",
            str(port),
            "--tls-cert-file",
            str(tmp_path / "server.crt"),
            "--tls-key-file",
            str(tmp_path / "server.key"),
            "--tls-ca-cert-file",
            str(tmp_path / "ca.crt"),
            "--tls-auth-clients",
            "no",
            "--requirepass",
            PASSWORD,
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(tmp_path),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"rediss://:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={tmp_path / 'ca.crt'}"
    try:
        eventually(lambda: _pings(url), 10, "the TLS redis-server to answer")
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


def _pings(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


def test_the_cluster_runs_over_rediss_with_a_private_ca(
    make_cluster: ClusterFactory, tls_redis_url: str
) -> None:
    plain = tls_redis_url.replace("rediss://", "redis://").split("?")[0]
    assert not _pings(plain)  # nothing answers in plain text: everything below is over TLS
    untrusted = tls_redis_url.split("?")[0]
    assert not _pings(untrusted)  # and the CA is really checked
    cluster = make_cluster(redis_url=tls_redis_url)
    body = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    with httpx.Client(base_url=cluster.base_url, timeout=60) as http:
        reply = http.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        assert reply.json()["usage"]["completion_tokens"] >= 1
        streamed = http.post("/v1/chat/completions", json=body | {"stream": True})
        assert streamed.text.rstrip().endswith("data: [DONE]")
        assert http.get("/readyz").status_code == 200
        models = http.get("/v1/models").json()["data"]
        assert [model["id"] for model in models] == [MODEL_NAME]
