"""Placement by prefix against a real Redis: ADMIT puts a placed job in its worker's own queue
only while the worker is listed live, START records the blocks a worker prefilled, the lookup
finds the deepest, a worker drains its own queue before its model's of each priority, and a
worker that leaves or dies has its queue handed to the model's queue in order."""

from __future__ import annotations

import pytest
import redis
import redis.asyncio
from rq.job import Job

from tokenrelay.api.cluster_view import _queue_depths
from tokenrelay.shared.events import Started
from tokenrelay.shared.generation import ChatMessage, GenerationRequest
from tokenrelay.shared.prefix_blocks import block_hashes
from tokenrelay.shared.redis import job_scripts, keys, placement
from tokenrelay.shared.redis.rq_jobs import (
    GENERATE_FUNCTION,
    Priority,
    generation_queue,
    queued_job,
)
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings
from tokenrelay.worker.rq_worker import build_worker

REQUEST = GenerationRequest(
    model="m", messages=(ChatMessage(role="user", content="hi"),), max_tokens=8
)


@pytest.fixture
def settings(redis_url: str) -> Settings:
    return Settings(redis_url=redis_url, max_inflight=100)


@pytest.fixture
def run(sync_redis: redis.Redis) -> SyncScripts:
    return SyncScripts(sync_redis)


@pytest.fixture
def rq_connection(redis_url: str) -> redis.Redis:
    return redis.Redis.from_url(redis_url)


def register(run: SyncScripts, settings: Settings, worker: str, *, placeable: bool = True) -> None:
    run.run(job_scripts.register_worker(settings, worker, "m", 2, placeable=placeable))


def admit(
    run: SyncScripts,
    settings: Settings,
    connection: redis.Redis,
    job_id: str,
    worker: str = "",
    priority: Priority = "normal",
) -> None:
    entry = queued_job(connection, settings, job_id, REQUEST, priority, worker=worker)
    job_scripts.check_admitted(
        run.run(job_scripts.admit(settings, job_id, "o", "m", enqueue=entry))
    )


def own_queue(connection: redis.Redis, worker: str, priority: str = "normal") -> list[str]:
    key = placement.worker_queue_keys(worker)[("high", "normal", "low").index(priority)]
    return [item.decode() for item in connection.lrange(key, 0, -1)]


def test_a_job_placed_on_a_live_worker_waits_in_its_own_queue_with_the_models_queue_as_origin(
    run: SyncScripts, settings: Settings, rq_connection: redis.Redis
) -> None:
    register(run, settings, "w1")
    admit(run, settings, rq_connection, "j1", worker="w1")
    assert own_queue(rq_connection, "w1") == ["j1"]
    assert generation_queue(rq_connection, "m", "normal").job_ids == []
    origin = Job.fetch("j1", connection=rq_connection).origin
    assert origin == keys.generation_queue("m", "normal")


def test_a_job_placed_on_a_worker_that_left_or_never_listed_goes_to_the_models_queue(
    run: SyncScripts, settings: Settings, rq_connection: redis.Redis
) -> None:
    register(run, settings, "w1")
    run.run(placement.sweep("m", leaving="w1"))
    admit(run, settings, rq_connection, "j1", worker="w1")
    admit(run, settings, rq_connection, "j2", worker="stranger")
    assert own_queue(rq_connection, "w1") == []
    assert generation_queue(rq_connection, "m", "normal").job_ids == ["j1", "j2"]
    register(run, settings, "w1", placeable=False)  # a leaving worker's heartbeat
    admit(run, settings, rq_connection, "j3", worker="w1")
    assert own_queue(rq_connection, "w1") == []


def test_a_leaving_workers_queues_go_to_the_front_of_the_models_queues_in_their_order(
    run: SyncScripts, settings: Settings, rq_connection: redis.Redis
) -> None:
    register(run, settings, "w1")
    register(run, settings, "w2")
    admit(run, settings, rq_connection, "shared", priority="normal")
    for job_id in ("a", "b"):
        admit(run, settings, rq_connection, job_id, worker="w1")
    admit(run, settings, rq_connection, "urgent", worker="w1", priority="high")
    admit(run, settings, rq_connection, "other", worker="w2")
    swept = placement.parse_sweep(run.run(placement.sweep("m", leaving="w1")))
    assert swept.moved == 3
    assert swept.backlogs == {"w2": 1}
    assert generation_queue(rq_connection, "m", "normal").job_ids == ["a", "b", "shared"]
    assert generation_queue(rq_connection, "m", "high").job_ids == ["urgent"]
    assert own_queue(rq_connection, "w1") == own_queue(rq_connection, "w1", "high") == []
    assert own_queue(rq_connection, "w2") == ["other"]


def test_a_dead_workers_queue_is_swept_once_its_heartbeat_expired(
    run: SyncScripts, settings: Settings, rq_connection: redis.Redis, sync_redis: redis.Redis
) -> None:
    register(run, settings, "dead")
    admit(run, settings, rq_connection, "a", worker="dead")
    assert placement.parse_sweep(run.run(placement.sweep("m"))).moved == 0
    sync_redis.zadd(keys.placement_workers("m"), {"dead": 1})  # its heartbeat expired
    admit(run, settings, rq_connection, "b", worker="dead")  # not placed on it any more
    swept = placement.parse_sweep(run.run(placement.sweep("m")))
    assert (swept.moved, swept.backlogs) == (1, {})
    assert generation_queue(rq_connection, "m", "normal").job_ids == ["a", "b"]
    assert sync_redis.zscore(keys.placement_workers("m"), "dead") is None


def test_start_records_the_blocks_a_worker_prefilled_and_the_lookup_finds_the_deepest(
    run: SyncScripts, settings: Settings, rq_connection: redis.Redis
) -> None:
    first = block_hashes("m", list(range(64)), 16)  # four blocks
    longer = block_hashes("m", list(range(64)) + [7] * 32, 16)  # the same four, two more
    other = block_hashes("m", [9] * 48, 16)
    assert placement.parse_lookup(run.run(placement.lookup(settings, "m", longer))) is None
    admit(run, settings, rq_connection, "j1")
    started = Started(worker="w1", prompt_tokens=64).to_wire()
    index = placement.index_args(settings, "m", first)
    reply = run.run(job_scripts.start(settings, "j1", "w1", started, index))
    assert job_scripts.parse_start(reply).status == "running"
    holder = placement.parse_lookup(run.run(placement.lookup(settings, "m", longer)))
    assert holder == placement.Holder("w1", 4)
    assert placement.parse_lookup(run.run(placement.lookup(settings, "m", other))) is None
    elsewhere = placement.parse_lookup(run.run(placement.lookup(settings, "other-model", first)))
    assert elsewhere is None


def test_start_records_nothing_with_placement_off(
    run: SyncScripts, settings: Settings, rq_connection: redis.Redis
) -> None:
    off = settings.model_copy(update={"prefix_placement": "off"})
    blocks = block_hashes("m", list(range(32)), 16)
    assert placement.index_args(off, "m", blocks) == []
    assert placement.index_args(settings, "m", []) == []


def test_a_worker_drains_its_own_queue_before_its_models_of_each_priority(
    run: SyncScripts, settings: Settings, rq_connection: redis.Redis
) -> None:
    register(run, settings, "w1")
    admit(run, settings, rq_connection, "shared-normal")
    admit(run, settings, rq_connection, "own-normal", worker="w1")
    admit(run, settings, rq_connection, "own-low", worker="w1", priority="low")
    admit(run, settings, rq_connection, "shared-high", priority="high")
    ran: list[str] = []

    def generate(job_id: str, request: dict[str, object]) -> dict[str, str]:
        ran.append(job_id)
        return {"status": "succeeded"}

    worker = build_worker(rq_connection, "w1", {GENERATE_FUNCTION: generate}, model="m")
    worker.work(burst=True)
    assert ran == ["shared-high", "own-normal", "shared-normal", "own-low"]


async def test_a_models_queue_depth_counts_the_jobs_placed_on_its_workers(
    run: SyncScripts,
    settings: Settings,
    rq_connection: redis.Redis,
    async_redis: redis.asyncio.Redis,
) -> None:
    """`/v1/cluster` and `tokenrelay_queue_depth` show what waits for a model, wherever: a
    job placed on a worker waits in that worker's own queue, which RQ does not list."""
    register(run, settings, "w1")
    admit(run, settings, rq_connection, "placed", worker="w1", priority="high")
    admit(run, settings, rq_connection, "shared")
    assert own_queue(rq_connection, "w1", "high") == ["placed"]
    depths = await _queue_depths(async_redis)
    assert depths[keys.generation_queue("m", "high")] == 1
    assert depths[keys.generation_queue("m", "normal")] == 1
    assert not [name for name in depths if "worker" in name]
