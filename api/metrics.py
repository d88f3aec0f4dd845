"""Prometheus metrics of an API process, and the cluster gauges read from Redis at scrape time.

Names follow vLLM and TGI, prefixed `tokenrelay_`:

    tokenrelay_requests_total{endpoint,status}     HTTP requests answered (not /metrics)
    tokenrelay_rejections_total{reason}            generation requests (POST) answered with
                                                   an error, by `error_type`
    tokenrelay_queue_wait_seconds                  job admission -> start (histogram)
    tokenrelay_time_to_first_token_seconds         request arrival -> first token forwarded
    tokenrelay_inter_token_latency_seconds         between forwarded tokens
    tokenrelay_e2e_request_latency_seconds         request arrival -> final event
    tokenrelay_prompt_tokens_total, tokenrelay_generation_tokens_total
    tokenrelay_requests_in_flight                  admitted, unfinished jobs (cluster-wide)
    tokenrelay_requests_in_flight_limit            TOKENRELAY_MAX_INFLIGHT
    tokenrelay_queue_depth{queue}                  jobs waiting in each RQ queue
    tokenrelay_workers                             live RQ workers
    tokenrelay_redis_up                            1 if this scrape could read Redis

Counters and histograms live in the process that served the request. With several uvicorn
workers, `tokenrelay api` points `PROMETHEUS_MULTIPROC_DIR` at a fresh directory before any
of them imports prometheus-client: each process then writes its values to files there, and
a scrape of any process merges all of them. The cluster gauges are not kept in processes at
all: a custom collector reads them from Redis at scrape time (bounded by timeouts; with
Redis down the scrape still answers, with `tokenrelay_redis_up 0` and without them).
Token metrics cover the generations the API streams back to their requester (chat
completions); an async job that nobody streams is counted only in the request metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Annotated, TypeVar

import redis.asyncio
from fastapi import Depends, Request
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from redis import Redis
from redis.backoff import NoBackoff
from redis.exceptions import RedisError
from redis.retry import Retry
from rq import Queue, Worker
from rq.serializers import JSONSerializer

from api import request_log
from api.request_log import RequestRecord
from shared import keys
from shared.events import Done, Error, Started, TokenChunk
from shared.jobs import JobStatus
from shared.settings import Settings

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"
REDIS_TIMEOUT_S = 1.0  # per Redis command of a scrape
SCRAPE_REDIS_BUDGET_S = 3.0  # all of a scrape's Redis reads together

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0, 160.0, 640.0)  # fmt: skip
_INTER_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                        0.5, 0.75, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
_QUEUE_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0,
                       20.0, 30.0, 45.0, 60.0, 120.0, 300.0)  # fmt: skip
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0,
                240.0, 480.0, 960.0, 1920.0)  # fmt: skip
_ERROR_STATUSES = {"cancelled": JobStatus.CANCELLED, "expired": JobStatus.EXPIRED}

T = TypeVar("T")


class Metrics:
    """The counters and histograms of one API process, and how to render a scrape."""

    def __init__(self, multiprocess_dir: str | None = None) -> None:
        self.multiprocess_dir = multiprocess_dir
        # Multiprocess mode: values live in files, merged at scrape time; nothing to register.
        self._registry = None if multiprocess_dir else CollectorRegistry()
        registry = self._registry
        self.requests = Counter(
            "tokenrelay_requests",
            "HTTP requests answered, by route template and status code (/metrics excluded).",
            ("endpoint", "status"),
            registry=registry,
        )
        self.rejections = Counter(
            "tokenrelay_rejections",
            "Generation requests (POST) answered with an error instead of a generation, "
            "by error_type.",
            ("reason",),
            registry=registry,
        )
        self.queue_wait = Histogram(
            "tokenrelay_queue_wait_seconds",
            "Time a job waited from admission to its start on a worker.",
            buckets=_QUEUE_WAIT_BUCKETS,
            registry=registry,
        )
        self.time_to_first_token = Histogram(
            "tokenrelay_time_to_first_token_seconds",
            "Time from a request's arrival to its first token chunk forwarded.",
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.inter_token_latency = Histogram(
            "tokenrelay_inter_token_latency_seconds",
            "Time between forwarded tokens (a chunk's gap divided over its tokens).",
            buckets=_INTER_TOKEN_BUCKETS,
            registry=registry,
        )
        self.e2e_latency = Histogram(
            "tokenrelay_e2e_request_latency_seconds",
            "Time from a generation request's arrival to its final event.",
            buckets=_E2E_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "tokenrelay_prompt_tokens",
            "Prompt tokens of the generations served.",
            registry=registry,
        )
        self.generation_tokens = Counter(
            "tokenrelay_generation_tokens",
            "Tokens generated for the generations served (as their chunks are forwarded).",
            registry=registry,
        )

    @classmethod
    def from_environment(cls) -> Metrics:
        """Multiprocess mode when `PROMETHEUS_MULTIPROC_DIR` was set before the import."""
        path = os.environ.get(MULTIPROC_DIR_ENV) or None
        if path is not None and values.ValueClass is values.MutexValue:
            raise RuntimeError(
                f"{MULTIPROC_DIR_ENV} was set after prometheus_client was imported; "
                "set it before the process starts (`tokenrelay api` does)"
            )
        return cls(path)

    def count_request(self, record: RequestRecord) -> None:
        """Count a finished HTTP request; an error answer to a POST is also a rejection."""
        if record.endpoint == "/metrics":
            return
        self.requests.labels(endpoint=record.endpoint, status=str(record.status)).inc()
        if record.method == "POST" and record.status is not None and record.status >= 400:
            self.rejections.labels(reason=record.error_type or "unknown").inc()

    async def render(self, settings: Settings) -> bytes:
        """The scrape: this process's (or all processes') values, then the cluster gauges."""
        snapshot = await read_cluster_snapshot(settings.redis_url)
        return await asyncio.to_thread(self._render, snapshot, settings.max_inflight)

    def _render(self, snapshot: ClusterSnapshot, max_inflight: int) -> bytes:
        registry = CollectorRegistry()
        if self.multiprocess_dir is not None:
            MultiProcessCollector(registry, path=self.multiprocess_dir)
        elif self._registry is not None:
            registry.register(self._registry)
        registry.register(ClusterCollector(snapshot, max_inflight))
        return generate_latest(registry)


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


MetricsDep = Annotated[Metrics, Depends(get_metrics)]


@dataclass
class ClusterSnapshot:
    """Cluster-wide gauges as read from Redis; `None` where the read failed."""

    redis_up: bool = False
    in_flight: int | None = None
    queues: dict[str, int] | None = None
    workers: int | None = None


class ClusterCollector:
    """Gauges from one `ClusterSnapshot` (a fresh collector per scrape)."""

    def __init__(self, snapshot: ClusterSnapshot, max_inflight: int) -> None:
        self.snapshot = snapshot
        self.max_inflight = max_inflight

    def collect(self) -> Iterable[Metric]:
        snapshot = self.snapshot
        yield GaugeMetricFamily(
            "tokenrelay_redis_up",
            "1 if this scrape could read the cluster state from Redis, else 0.",
            value=int(snapshot.redis_up),
        )
        yield GaugeMetricFamily(
            "tokenrelay_requests_in_flight_limit",
            "The global admission limit (TOKENRELAY_MAX_INFLIGHT).",
            value=self.max_inflight,
        )
        if snapshot.in_flight is not None:
            yield GaugeMetricFamily(
                "tokenrelay_requests_in_flight",
                "Admitted, unfinished jobs across the cluster (queued or running).",
                value=snapshot.in_flight,
            )
        if snapshot.queues is not None:
            depth = GaugeMetricFamily(
                "tokenrelay_queue_depth", "Jobs waiting in an RQ queue.", labels=("queue",)
            )
            for name, count in sorted(snapshot.queues.items()):
                depth.add_metric((name,), count)
            yield depth
        if snapshot.workers is not None:
            yield GaugeMetricFamily(
                "tokenrelay_workers",
                "Live model workers (registered in RQ).",
                value=snapshot.workers,
            )


async def read_cluster_snapshot(redis_url: str) -> ClusterSnapshot:
    """Read the cluster gauges within `SCRAPE_REDIS_BUDGET_S`; never raises."""
    snapshot = ClusterSnapshot()
    with contextlib.suppress(TimeoutError):  # then report what was read in time
        await asyncio.wait_for(
            asyncio.to_thread(_read_cluster, redis_url, snapshot), SCRAPE_REDIS_BUDGET_S
        )
    return ClusterSnapshot(
        redis_up=snapshot.redis_up,
        in_flight=snapshot.in_flight,
        queues=snapshot.queues,
        workers=snapshot.workers,
    )


def _read_cluster(redis_url: str, snapshot: ClusterSnapshot) -> None:
    """Fill `snapshot` part by part, on a short-lived connection with short timeouts."""
    connection = Redis.from_url(
        redis_url,
        socket_timeout=REDIS_TIMEOUT_S,
        socket_connect_timeout=REDIS_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        snapshot.in_flight = int(connection.zcard(keys.leases()))
        snapshot.redis_up = True
        with contextlib.suppress(RedisError, OSError):
            found = Queue.all(connection=connection, serializer=JSONSerializer)
            snapshot.queues = {queue.name: queue.count for queue in found}
        with contextlib.suppress(RedisError, OSError):
            snapshot.workers = len(Worker.all(connection=connection, serializer=JSONSerializer))
    except (RedisError, OSError):
        pass
    finally:
        connection.close()


async def observe_events(
    client: redis.asyncio.Redis, job_id: str, events: AsyncIterator[T]
) -> AsyncIterator[T]:
    """Pass a job's events through, observing them for the current request's metrics and log.

    Routes that stream a generation back to its requester wrap the job's events in this.
    """
    record = request_log.current()
    if record is None or record.metrics is None:
        async for event in events:
            yield event
        return
    stream = _StreamObserver(record, record.metrics)
    async for event in events:
        if isinstance(event, Started):
            await stream.started(client, job_id, event)
        elif isinstance(event, TokenChunk):
            stream.chunk(event)
        elif isinstance(event, Done | Error):
            stream.ended(event)
        yield event


@dataclass
class _StreamObserver:
    record: RequestRecord
    metrics: Metrics
    last_chunk: float | None = None
    tokens: int = 0
    seen_started: bool = False

    async def started(self, client: redis.asyncio.Redis, job_id: str, event: Started) -> None:
        if self.seen_started:
            return
        self.seen_started = True
        self.record.prompt_tokens = event.prompt_tokens
        self.metrics.prompt_tokens.inc(event.prompt_tokens)
        wait = await _queue_wait(client, job_id)
        if wait is not None:
            self.record.queue_wait_s = wait
            self.metrics.queue_wait.observe(wait)

    def chunk(self, event: TokenChunk) -> None:
        now = self.record.since_arrival()
        if self.last_chunk is None:
            self.record.ttft_s = now
            self.metrics.time_to_first_token.observe(now)
        elif event.tokens > 0:
            per_token = (now - self.last_chunk) / event.tokens
            for _ in range(event.tokens):
                self.metrics.inter_token_latency.observe(per_token)
        self.last_chunk = now
        self.tokens += event.tokens
        self.record.completion_tokens = self.tokens
        self.metrics.generation_tokens.inc(event.tokens)

    def ended(self, event: Done | Error) -> None:
        self.metrics.e2e_latency.observe(self.record.since_arrival())
        if isinstance(event, Done):
            # Tokens that yielded no text (end-of-sequence) reach no chunk; usage counts them.
            if (silent := event.usage.completion_tokens - self.tokens) > 0:
                self.metrics.generation_tokens.inc(silent)
            self.record.job_status = JobStatus.SUCCEEDED
            self.record.finish_reason = event.finish_reason
            self.record.prompt_tokens = event.usage.prompt_tokens
            self.record.completion_tokens = event.usage.completion_tokens
        else:
            self.record.job_status = _ERROR_STATUSES.get(event.error_type, JobStatus.FAILED)
            self.record.error_type = event.error_type


async def _queue_wait(client: redis.asyncio.Redis, job_id: str) -> float | None:
    """`started_at - created_at` from the job hash (both Redis `TIME`), or `None`."""
    try:
        async with asyncio.timeout(REDIS_TIMEOUT_S):
            created, started = await client.hmget(keys.job(job_id), ["created_at", "started_at"])
    except (RedisError, OSError, TimeoutError):
        return None
    if created is None or started is None:
        return None
    return max(0.0, float(started) - float(created))
