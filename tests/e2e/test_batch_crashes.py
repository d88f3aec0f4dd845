"""A batch survives what dies under it: a worker SIGKILLed (its lines' jobs are lost and run
again), the API process feeding it SIGKILLed (another claims it once its lease runs out),
Redis SIGKILLed and restarted on its AOF. Every line ends completed once or failed once."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import openai
import pytest
import redis

from tests.e2e.test_batches import chat_line, lines_of, upload, wait_for
from tests.support.cluster import Cluster, ClusterFactory
from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.shared.redis import keys
from tokenrelay.testing.polling import eventually

pytestmark = pytest.mark.timeout(360)  # a cluster, a crash, a restart and a whole batch

LINES = 24
SETTINGS = {
    "TOKENRELAY_LEASE_TTL_S": "3",
    "TOKENRELAY_BATCH_LEASE_S": "2",
    "TOKENRELAY_MAX_INFLIGHT": "8",
    "TOKENRELAY_MAX_QUEUE_WAIT_S": "60",
    "TOKENRELAY_BATCH_LINE_MAX_ATTEMPTS": "5",
    "OMP_NUM_THREADS": "1",
}


@pytest.fixture
def persistent_redis() -> Iterator[EmbeddedRedis]:
    with EmbeddedRedis(persistent=True) as server:
        yield server


def connect(cluster: Cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="unused", max_retries=3)


def start_batch(client: openai.OpenAI) -> str:
    lines = [chat_line(f"c-{i}", max_tokens=40, min_tokens=40) for i in range(LINES)]
    batch = client.batches.create(
        input_file_id=upload(client, lines),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    return batch.id


def batch_lines_running(cluster: Cluster) -> bool:
    client = redis.Redis.from_url(cluster.redis_url)
    try:
        return int(client.scard(keys.batch_lines_inflight())) > 0
    finally:
        client.close()


def check_every_line_once(client: openai.OpenAI, batch_id: str) -> None:
    done = wait_for(client, batch_id, {"completed"}, timeout_s=180)
    counts = done.request_counts
    assert counts is not None and counts.total == LINES
    output = lines_of(client, done.output_file_id)
    errors = lines_of(client, done.error_file_id)
    seen = Counter(line["custom_id"] for line in output + errors)
    assert seen == Counter(f"c-{i}" for i in range(LINES))  # each exactly once
    assert (counts.completed, counts.failed) == (len(output), len(errors))
    assert counts.completed >= LINES - 2, errors  # lost jobs ran again, not failed


def test_a_worker_sigkill_mid_batch_runs_its_lines_again(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(SETTINGS)
    [worker] = [c for c in cluster.group.children if c.name == "worker"]
    with connect(cluster) as client:
        batch_id = start_batch(client)
        eventually(lambda: batch_lines_running(cluster), 60, "batch lines to run")
        time.sleep(1)  # well into their decoding
        worker.kill()
        cluster.group.remove(worker)
        cluster.start_worker()
        check_every_line_once(client, batch_id)


def test_an_api_sigkill_hands_the_batch_to_another_api(make_cluster: ClusterFactory) -> None:
    cluster = make_cluster(SETTINGS)
    [first_api] = [c for c in cluster.group.children if c.name == "api"]
    with connect(cluster) as client:
        batch_id = start_batch(client)
        eventually(lambda: batch_lines_running(cluster), 60, "batch lines to run")
    first_api.kill()
    cluster.group.remove(first_api)
    cluster.start_api()
    with connect(cluster) as client:
        check_every_line_once(client, batch_id)


def test_a_redis_sigkill_and_restart_on_its_aof_loses_no_line(
    persistent_redis: EmbeddedRedis, make_cluster: ClusterFactory
) -> None:
    settings = {**SETTINGS, "TOKENRELAY_LEASE_TTL_S": "10"}
    cluster = make_cluster(settings, redis_url=persistent_redis.url)
    with connect(cluster) as client:
        batch_id = start_batch(client)
        eventually(lambda: batch_lines_running(cluster), 60, "batch lines to run")
        time.sleep(1.5)  # past an AOF fsync of the batch's first admissions
        persistent_redis.stop(graceful=False)
        time.sleep(1)  # the outage itself, not a synchronisation
        persistent_redis.start()
        check_every_line_once(client, batch_id)
