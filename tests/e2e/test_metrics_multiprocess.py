"""Metrics across the uvicorn workers of one real API process: every scrape merges their
counters."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.support.cluster import MODEL_NAME, Cluster, ClusterFactory
from tests.support.metrics import parse, value
from tokenrelay.shared.redis import keys


@pytest.fixture(scope="module")
def cluster(make_module_cluster: ClusterFactory) -> Cluster:
    return make_module_cluster({"TOKENRELAY_WORKER_CONCURRENCY": "2"}, api_workers=2)


def api_request_lines(cluster: Cluster) -> list[dict[str, object]]:
    lines = []
    for path in cluster.log_dir.glob("api-*.log"):
        for text in path.read_text().splitlines():
            if text.startswith("{"):
                lines.append(json.loads(text))
    return lines


MAX_SPREAD_ATTEMPTS = 200


def test_counters_of_both_uvicorn_workers_are_merged_in_every_scrape(cluster: Cluster) -> None:
    # Cheap refused requests, each on a new connection, until both API processes served some:
    # the request log names the process (`pid`) that served each one.
    invalid = 0
    pids: set[object] = set()
    while len(pids) < 2:
        assert invalid < MAX_SPREAD_ATTEMPTS, "every request went to the same API process"
        response = httpx.post(f"{cluster.base_url}/v1/chat/completions", json={"model": "x"})
        assert response.status_code == 400
        invalid += 1
        pids = {line["pid"] for line in api_request_lines(cluster) if line["status"] == 400}

    generated = 0
    with openai.OpenAI(base_url=f"{cluster.base_url}/v1", api_key="-", max_retries=0) as client:
        for stream in (True, True, True, False, False):
            # Seeded: the tiny model's random weights sometimes give 8 tokens that decode to no
            # text, and a reply without text has no first token to time.
            body = {"min_tokens": 4, "seed": 1}
            if stream:
                chunks = list(
                    client.chat.completions.create(
                        model=MODEL_NAME,
                        messages=[{"role": "user", "content": "hi"}],
                        max_tokens=8,
                        stream=True,
                        stream_options={"include_usage": True},
                        extra_body=body,
                    )
                )
                usage = chunks[-1].usage
            else:
                usage = client.chat.completions.create(
                    model=MODEL_NAME,
                    messages=[{"role": "user", "content": "hi"}],
                    max_tokens=8,
                    extra_body=body,
                ).usage
            assert usage is not None
            generated += usage.completion_tokens

    chat = "/v1/chat/completions"
    for _ in range(6):  # new connections: the scrapes land on either process
        samples = parse(httpx.get(f"{cluster.base_url}/metrics", timeout=10).text)[1]
        assert value(samples, "tokenrelay_requests_total", endpoint=chat, status="400") == invalid
        assert value(samples, "tokenrelay_requests_total", endpoint=chat, status="200") == 5
        rejected = value(samples, "tokenrelay_rejections_total", reason="invalid_request_error")
        assert rejected == invalid
        assert value(samples, "tokenrelay_time_to_first_token_seconds_count") == 5
        assert value(samples, "tokenrelay_queue_wait_seconds_count") == 5
        assert value(samples, "tokenrelay_generation_tokens_total") == generated
        assert 0 < (value(samples, "tokenrelay_inter_token_latency_seconds_count") or 0) < generated
        assert value(samples, "tokenrelay_requests_in_flight") == 0
        queue = keys.generation_queue(MODEL_NAME, "normal")
        assert value(samples, "tokenrelay_queue_depth", queue=queue) == 0
        assert value(samples, "tokenrelay_workers") == 1
    served = [line for line in api_request_lines(cluster) if line["status"] == 200]
    assert {line["job_status"] for line in served if line["path"] == chat} == {"succeeded"}
    assert all(line["completion_tokens"] and line["ttft_s"] is not None
               for line in served if line["path"] == chat)  # fmt: skip
