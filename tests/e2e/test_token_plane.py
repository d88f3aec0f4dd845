"""The token plane on a Redis of its own (`TOKENRELAY_STREAM_REDIS_URL`): a second plain Redis
for the scripts' split, and a real three-primary Redis Cluster for sharded pub/sub and the
whole path through real processes. The control Redis keeps admission, RQ and webhooks and
never holds a job's event log, channel or text."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster
from fastapi.testclient import TestClient

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory, stream_chat
from tokenrelay.api.app import create_app
from tokenrelay.api.streaming.hub import Delivery, StreamHub
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared.events import Done, Started, TokenChunk, Usage
from tokenrelay.shared.redis import job_scripts, keys, plane_scripts
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.redis.token_plane import drain_outbox_sync
from tokenrelay.shared.settings import Settings
from tokenrelay.testing.cluster import EmbeddedCluster, embedded_cluster
from tokenrelay.testing.polling import eventually

MESSAGES = [{"role": "user", "content": "写一首诗 about the sea 🌊"}]
TOKEN_KEY_PATTERN = "tokenrelay:job:{*"


def started(worker: str = "w1") -> str:
    return Started(worker=worker, prompt_tokens=3).to_wire()


def chunk(text: str) -> str:
    return TokenChunk(text=text, tokens=1).to_wire()


def done(tokens: int) -> str:
    usage = Usage(prompt_tokens=3, completion_tokens=tokens, total_tokens=3 + tokens)
    return Done(finish_reason="stop", usage=usage).to_wire()


def log_events(client: redis.Redis, job_id: str) -> list[dict]:
    entries: Any = client.xrange(keys.job_events(job_id))
    return [json.loads(fields["e"]) for _, fields in entries]


@pytest.fixture
def plane_server() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(persistent=True) as server:
        yield server


@pytest.fixture
def split(settings: Settings, plane_server: EmbeddedRedis) -> Settings:
    return settings.model_copy(update={"stream_redis_url": plane_server.url})


@pytest.fixture
def plane(plane_server: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(plane_server.url, decode_responses=True)
    yield client
    client.close()


def admit_and_start(split: Settings, control: SyncScripts, plane: SyncScripts, job: str) -> None:
    job_scripts.check_admitted(control.run(job_scripts.admit(split, job, "owner", "m")))
    assert control.run(job_scripts.start(split, job, "w1", started())) == "running"
    assert plane.run(plane_scripts.open_log(split, job, started())) == 1


def test_a_worker_s_job_lives_on_the_token_plane_and_ends_on_both(
    split: Settings, sync_redis: redis.Redis, plane: redis.Redis
) -> None:
    control, on_plane = SyncScripts(sync_redis), SyncScripts(plane)
    admit_and_start(split, control, on_plane, "s")
    assert on_plane.run(plane_scripts.open_log(split, "s", started())) == 0  # a resend adds nothing
    events = [("s", 1, chunk("你好")), ("s", 2, chunk("🚀"))]
    assert on_plane.run(plane_scripts.emit(split, events)) == [[], []]
    assert (
        on_plane.run(plane_scripts.close_log(split, "s", done(2), 4, "你好🚀")) == -1
    )  # lacks seq 3
    close = plane_scripts.close_log(split, "s", done(2), 3, "你好🚀")
    assert on_plane.run(close) == 1
    assert on_plane.run(close) == 1  # a resend finds it closed so
    assert on_plane.run(plane_scripts.close_log(split, "s", done(9), 3, "other")) == 0
    finish = job_scripts.finish(split, "s", "succeeded", {"completion_tokens": 2}, "")
    assert control.run(finish) == 1
    assert control.run(finish) == 1  # a resend finds the job succeeded
    assert [e["seq"] for e in log_events(plane, "s")] == [0, 1, 2, 3]
    assert plane.get(keys.job_text("s")) == "你好🚀"
    assert 0 < plane.ttl(keys.job_text("s")) <= split.result_ttl_s
    assert 0 < plane.ttl(keys.job_events("s")) <= split.result_ttl_s
    assert on_plane.run(plane_scripts.emit(split, [("s", 3, chunk("late"))])) == [["s"], []]
    assert sync_redis.hget(keys.job("s"), "status") == "succeeded"
    assert sync_redis.keys(TOKEN_KEY_PATTERN) == []
    assert sync_redis.hlen(keys.token_plane_outbox()) == 0


def test_jobs_ended_on_the_control_redis_have_their_logs_closed_from_the_outbox(
    split: Settings, sync_redis: redis.Redis, plane: redis.Redis
) -> None:
    control, on_plane = SyncScripts(sync_redis), SyncScripts(plane)
    job_scripts.check_admitted(control.run(job_scripts.admit(split, "queued", "owner", "m")))
    assert control.run(job_scripts.cancel(split, "queued")) == "cancelled"
    short_lease = split.model_copy(update={"lease_ttl_s": 0.001})
    admit_and_start(short_lease, control, on_plane, "lost")
    assert on_plane.run(plane_scripts.emit(split, [("lost", 1, chunk("a"))])) == [[], []]
    reaped: list[str] = []

    def reap() -> list[str]:
        reaped.extend(control.run(job_scripts.reap(split)))
        return reaped

    eventually(reap, 5, "the reaping of the job whose lease was a millisecond")
    assert reaped == ["lost"]
    assert [e["type"] for e in log_events(plane, "lost")] == ["started", "token"]
    assert not plane.exists(keys.job_events("queued"))
    assert sync_redis.hlen(keys.token_plane_outbox()) == 2
    assert drain_outbox_sync(sync_redis, on_plane, split) == 2
    assert drain_outbox_sync(sync_redis, on_plane, split) == 0
    lost, queued = log_events(plane, "lost"), log_events(plane, "queued")
    assert [e["seq"] for e in lost] == [0, 1, 2]
    assert lost[-1]["type"] == "error" and lost[-1]["error_type"] == "worker_lost"
    assert [(e["seq"], e["error_type"]) for e in queued] == [(0, "cancelled")]
    assert on_plane.run(plane_scripts.emit(split, [("lost", 2, chunk("b"))])) == [["lost"], []]
    assert sync_redis.keys(TOKEN_KEY_PATTERN) == []


@pytest.fixture(scope="module")
def shards() -> Iterator[EmbeddedCluster]:
    with embedded_cluster() as cluster:
        yield cluster


@pytest.fixture
def on_cluster(settings: Settings, shards: EmbeddedCluster) -> Settings:
    update = {"stream_redis_url": shards.url, "stream_redis_cluster": True}
    return settings.model_copy(update=update)


@pytest.fixture
def cluster_client(shards: EmbeddedCluster) -> Iterator[redis.cluster.RedisCluster]:
    client = redis.cluster.RedisCluster.from_url(shards.url, decode_responses=True)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
async def async_cluster_client(
    shards: EmbeddedCluster,
) -> AsyncIterator[redis.asyncio.cluster.RedisCluster]:
    client = redis.asyncio.cluster.RedisCluster.from_url(shards.url, decode_responses=True)
    yield client
    await client.aclose()


def ids_on_every_shard(shards: EmbeddedCluster, count: int) -> list[str]:
    """`count` job ids per primary, by the slot their hash tag names."""
    ranges: dict[int, list[str]] = {node.port: [] for node in shards.nodes}
    with redis.cluster.RedisCluster.from_url(shards.url) as client:
        n = 0
        while any(len(ids) < count for ids in ranges.values()):
            job_id = f"job{n}"
            node = client.get_node_from_key(keys.job_events(job_id))
            assert node is not None
            if len(ranges[int(node.port)]) < count:
                ranges[int(node.port)].append(job_id)
            n += 1
    return [job_id for ids in ranges.values() for job_id in ids]


async def test_the_stream_hub_reads_sharded_channels_on_every_primary(
    on_cluster: Settings,
    shards: EmbeddedCluster,
    cluster_client: redis.cluster.RedisCluster,
    async_cluster_client: redis.asyncio.cluster.RedisCluster,
) -> None:
    on_plane = SyncScripts(cluster_client)
    job_ids = ids_on_every_shard(shards, 2)
    for job_id in job_ids:
        assert on_plane.run(plane_scripts.open_log(on_cluster, job_id, started())) == 1
    hub = StreamHub(async_cluster_client)
    hub.start()

    async def read(job_id: str) -> list[Delivery]:
        return [item async for item in hub.events(job_id, idle_s=10) if isinstance(item, Delivery)]

    def produce() -> None:
        for seq in range(1, 6):
            for job_id in job_ids:
                emitted = on_plane.run(
                    plane_scripts.emit(on_cluster, [(job_id, seq, chunk(f"{seq}"))])
                )
                assert emitted == [[], []]
        for job_id in job_ids:
            assert (
                on_plane.run(plane_scripts.close_log(on_cluster, job_id, done(5), 6, "12345")) == 1
            )

    try:
        readers = [asyncio.create_task(read(job_id)) for job_id in job_ids]
        await asyncio.wait_for(_subscribed(hub, len(job_ids)), 10)
        await asyncio.to_thread(produce)
        results = await asyncio.wait_for(asyncio.gather(*readers), 20)
    finally:
        await hub.close()
    for deliveries in results:
        assert [d.event.seq for d in deliveries] == list(range(7))
        assert "".join(d.event.text for d in deliveries if isinstance(d.event, TokenChunk)) == (
            "12345"
        )
    holders = {shards.node_holding(keys.job_events(job_id)) for job_id in job_ids}
    assert holders == {node.port for node in shards.nodes}
    for job_id in job_ids:
        text_node = shards.node_holding(keys.job_text(job_id))
        assert text_node == shards.node_holding(keys.job_events(job_id))


async def _subscribed(hub: StreamHub, count: int) -> None:
    while hub.channel_count < count:
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def gateway(make_module_cluster: ClusterFactory, shards: EmbeddedCluster) -> Cluster:
    return make_module_cluster(
        {
            "TOKENRELAY_STREAM_REDIS_URL": shards.url,
            "TOKENRELAY_STREAM_REDIS_CLUSTER": "1",
            "TOKENRELAY_MAX_INFLIGHT": "40",
            "TOKENRELAY_LEASE_TTL_S": "3",
            "TOKENRELAY_WORKER_CONCURRENCY": "8",
        }
    )


def test_emit_on_a_cluster_refuses_reader_channels() -> None:
    """A cluster's EMIT declares every key and shard channel it touches; a reader's channel
    (a plain Redis's batching) is not one of them, so building such a call is refused."""
    cluster = Settings(stream_redis_url="redis://127.0.0.1:1/0", stream_redis_cluster=True)
    events = [("j", 1, chunk("a"))]
    with pytest.raises(ValueError, match="plain Redis only"):
        plane_scripts.emit(cluster, events, {"j": keys.reader_channel("r")})
    assert plane_scripts.emit(cluster, events).keys == [keys.job_events("j"), keys.job_channel("j")]


def test_chat_streams_replays_and_cancels_with_the_token_plane_on_a_cluster(
    gateway: Cluster, shards: EmbeddedCluster
) -> None:
    streams = 32  # over three shards: one without a job is a (2/3)^32 chance
    results: list[tuple[str, str]] = [("", "")] * streams

    def one(i: int) -> None:
        results[i] = stream_chat(gateway.base_url, 12, MESSAGES)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    holders: set[int] = set()
    with httpx.Client(base_url=gateway.base_url, timeout=30) as http:
        for job_id, text in results:
            assert job_id and text
            # The control-side FINISH follows the token plane's CLOSE by one round trip.
            eventually(functools.partial(succeeded, http, job_id), 10, f"{job_id} succeeded")
            assert http.get(f"/v1/jobs/{job_id}").json()["text"] == text
            replay = job_events(http, job_id)
            assert [e["seq"] for e in replay] == list(range(len(replay)))
            assert "".join(e["text"] for e in replay if e["type"] == "token") == text
            assert job_events(http, job_id, last_event_id=1) == replay[2:]
            holders.add(shards.node_holding(keys.job_text(job_id)))
        assert holders == {node.port for node in shards.nodes}

        body = {"model": MODEL_NAME, "messages": MESSAGES, "max_tokens": 1500, "min_tokens": 1500}
        job_id = http.post("/v1/jobs", json=body).json()["id"]
        with http.stream("GET", f"/v1/jobs/{job_id}/events") as response:
            lines = response.iter_lines()
            next(line for line in lines if '"type":"token"' in line.replace(" ", ""))
            assert http.delete(f"/v1/jobs/{job_id}").status_code == 200
            tail = [json.loads(line[6:]) for line in lines if line.startswith("data: ")]
        assert tail[-1]["type"] == "error" and tail[-1]["error_type"] == "cancelled"
    with redis.Redis.from_url(gateway.redis_url) as control:
        eventually(lambda: control.zcard(keys.leases()) == 0, 10, "every lease released")
        assert control.keys(TOKEN_KEY_PATTERN) == []
        assert control.hlen(keys.token_plane_outbox()) == 0


def succeeded(http: httpx.Client, job_id: str) -> bool:
    return bool(http.get(f"/v1/jobs/{job_id}").json()["status"] == "succeeded")


def job_events(http: httpx.Client, job_id: str, last_event_id: int | None = None) -> list[dict]:
    headers = {} if last_event_id is None else {"Last-Event-ID": str(last_event_id)}
    with http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as response:
        assert response.status_code == 200
        return [
            json.loads(line.removeprefix("data: "))
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]


def test_the_api_closes_logs_on_the_token_plane_and_is_unready_without_it(
    split: Settings, plane_server: EmbeddedRedis, plane: redis.Redis, sync_redis: redis.Redis
) -> None:
    app = create_app(split.model_copy(update={"served_model_name": "m"}))
    with TestClient(app) as client:
        assert client.get("/readyz").status_code == 200
        job_id = client.post("/v1/jobs", json={"model": "m", "messages": MESSAGES}).json()["id"]
        assert client.delete(f"/v1/jobs/{job_id}").json()["status"] == "cancelled"
        stream = client.get(f"/v1/jobs/{job_id}/events").text.splitlines()
        sent = [json.loads(line[6:]) for line in stream if line.startswith("data: ")]
        assert [(e["seq"], e["type"], e["error_type"]) for e in sent] == [(0, "error", "cancelled")]
        assert log_events(plane, job_id) == sent
        assert sync_redis.hlen(keys.token_plane_outbox()) == 0
        assert sync_redis.keys(TOKEN_KEY_PATTERN) == []
        plane_server.stop()
        try:
            response = client.get("/readyz")
            assert response.status_code == 503
            assert "token plane" in response.json()["error"]["message"]
        finally:
            plane_server.start()
        eventually(lambda: client.get("/readyz").status_code == 200, 10, "ready again")
