"""Prometheus metrics of an API process, and the scrape that adds the cluster gauges.

Names follow vLLM and TGI, prefixed `tokenrelay_`:

    tokenrelay_requests_total{endpoint,status}     HTTP requests answered (not /metrics)
    tokenrelay_rejections_total{reason}            generation requests (POST) answered with
                                                   an error, by `error_type`
    tokenrelay_queue_wait_seconds                  job admission -> start (histogram)
    tokenrelay_time_to_first_token_seconds         request arrival -> first token forwarded
    tokenrelay_inter_token_latency_seconds         between forwarded tokens
    tokenrelay_e2e_request_latency_seconds         request arrival -> final event
    tokenrelay_prompt_tokens_total, tokenrelay_generation_tokens_total
    tokenrelay_prompt_tokens_served_total{source}  prompt tokens of finished generations, by
                                                   `cache` (a worker's prefix cache) or
                                                   `prefill` (computed)
    tokenrelay_placements_total{queue}             jobs with a whole prompt block, by the
                                                   queue admission chose: `prefix` (a
                                                   worker's own) or `shared` (the model's)
    tokenrelay_requests_in_flight                  admitted, unfinished jobs (cluster-wide)
    tokenrelay_requests_in_flight_limit            TOKENRELAY_MAX_INFLIGHT
    tokenrelay_queue_depth{queue}                  jobs waiting in each of tokenrelay's queues
    tokenrelay_workers                             live tokenrelay workers registered in RQ
    tokenrelay_job_migrations_total                running jobs continued on another worker
                                                   (cluster-wide, from Redis)
    tokenrelay_redis_up                            1 if this scrape read Redis on its primary

Counters and histograms live in the process that served the request (the request log counts
requests, `api.streaming.observer` the tokens and latencies). With several uvicorn workers,
`tokenrelay api` points `PROMETHEUS_MULTIPROC_DIR` at a fresh directory before any of them
imports prometheus-client: each process then writes its values to files there, and a scrape
of any process merges all of them. The cluster gauges are not kept in processes at all:
`api.cluster_view.read_gauges` reads them from Redis at scrape time (bounded by timeouts;
with Redis down the scrape still answers, with `tokenrelay_redis_up 0` and without them).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Annotated

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest, values
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector

from tokenrelay.api.cluster_view import ClusterGauges

MULTIPROC_DIR_ENV = "PROMETHEUS_MULTIPROC_DIR"

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
                    40.0, 80.0, 160.0, 640.0)  # fmt: skip
_INTER_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                        0.5, 0.75, 1.0, 2.5, 5.0, 10.0)  # fmt: skip
_QUEUE_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0,
                       20.0, 30.0, 45.0, 60.0, 120.0, 300.0)  # fmt: skip
_E2E_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 120.0,
                240.0, 480.0, 960.0, 1920.0)  # fmt: skip


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
        self.batch_lines = Counter(
            "tokenrelay_batch_lines",
            "Batch lines whose result was written, by outcome (completed, failed, cancelled, "
            "expired), counted by the API process whose feeder wrote it.",
            ("outcome",),
            registry=registry,
        )
        self.prompt_tokens = Counter(
            "tokenrelay_prompt_tokens",
            "Prompt tokens of the generations served.",
            registry=registry,
        )
        self.prompt_tokens_served = Counter(
            "tokenrelay_prompt_tokens_served",
            "Prompt tokens of the generations that finished, by source: a worker's prefix "
            "cache (cache) or computed (prefill). Workers export no metrics: their Done "
            "event's usage says how many of its prompt tokens were cached.",
            ("source",),
            registry=registry,
        )
        self.placements = Counter(
            "tokenrelay_placements",
            "Admitted jobs whose prompt has a whole block, by the queue placement by prefix "
            "chose: prefix (the own queue of the worker likely to hold its longest prefix) "
            "or shared (the model's queue).",
            ("queue",),
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

    def count_request(
        self, method: str, endpoint: str, status: int, error_type: str | None
    ) -> None:
        """Count a finished HTTP request; an error answer to a POST is also a rejection."""
        if endpoint == "/metrics":
            return
        self.requests.labels(endpoint=endpoint, status=str(status)).inc()
        if method == "POST" and status >= 400:
            self.rejections.labels(reason=error_type or "unknown").inc()

    def count_placement(self, queue: str) -> None:
        """Count a hashed job's placement (`api.jobs.placement`)."""
        self.placements.labels(queue=queue).inc()

    async def render(self, gauges: ClusterGauges) -> bytes:
        """The scrape: this process's (or all processes') values, then the cluster gauges."""
        return await asyncio.to_thread(self._render, gauges)

    def _render(self, gauges: ClusterGauges) -> bytes:
        registry = CollectorRegistry()
        if self.multiprocess_dir is not None:
            MultiProcessCollector(registry, path=self.multiprocess_dir)
        elif self._registry is not None:
            registry.register(self._registry)
        registry.register(ClusterCollector(gauges))
        return generate_latest(registry)


def get_metrics(request: Request) -> Metrics:
    metrics: Metrics = request.app.state.metrics
    return metrics


MetricsDep = Annotated[Metrics, Depends(get_metrics)]


class ClusterCollector:
    """Gauges from one `ClusterGauges` reading (a fresh collector per scrape)."""

    def __init__(self, gauges: ClusterGauges) -> None:
        self.gauges = gauges

    def collect(self) -> Iterable[Metric]:
        gauges = self.gauges
        yield GaugeMetricFamily(
            "tokenrelay_redis_up",
            "1 if this scrape read the cluster state from a Redis primary (writable), else 0.",
            value=int(gauges.redis_up),
        )
        yield GaugeMetricFamily(
            "tokenrelay_requests_in_flight_limit",
            "The global admission limit (TOKENRELAY_MAX_INFLIGHT).",
            value=gauges.max_inflight,
        )
        if gauges.in_flight is not None:
            yield GaugeMetricFamily(
                "tokenrelay_requests_in_flight",
                "Admitted, unfinished jobs across the cluster (queued or running).",
                value=gauges.in_flight,
            )
        if gauges.queues is not None:
            depth = GaugeMetricFamily(
                "tokenrelay_queue_depth", "Jobs waiting in an RQ queue.", labels=("queue",)
            )
            for name, count in sorted(gauges.queues.items()):
                depth.add_metric((name,), count)
            yield depth
        if gauges.workers is not None:
            yield GaugeMetricFamily(
                "tokenrelay_workers",
                "Live model workers (registered in RQ).",
                value=gauges.workers,
            )
        if gauges.migrations is not None:
            yield CounterMetricFamily(
                "tokenrelay_job_migrations",
                "Running jobs whose worker was lost or stopped, put back in their queue to "
                "continue on another worker from the tokens already delivered.",
                value=gauges.migrations,
            )
