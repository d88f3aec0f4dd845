"""Observe the events of a generation streamed back to its requester: latency and token
metrics (`api.metrics`), and the fields of the request's log line (`api.middleware.request_log`).

Routes that return a generation to its requester (chat and text completions, the article
routes) wrap the job's events in `observe_events`; a job's event stream
(`GET /v1/jobs/{id}/events`) is not observed.

HOT PATH (docs/architecture.md, "The per-token path"): measure with `python -m bench.gateway`
before and after changing it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import redis.asyncio
from redis.exceptions import RedisError

from tokenrelay.api.metrics import Metrics
from tokenrelay.api.middleware import request_log
from tokenrelay.api.middleware.request_log import RequestRecord
from tokenrelay.api.streaming.hub import Delivery, StreamItem
from tokenrelay.shared.events import Done, Error, Started, TokenChunk
from tokenrelay.shared.jobs import JobField, JobStatus
from tokenrelay.shared.redis import keys

QUEUE_WAIT_TIMEOUT_S = 1.0  # reading a job's timestamps for its queue wait
_ERROR_STATUSES = {"cancelled": JobStatus.CANCELLED, "expired": JobStatus.EXPIRED}


async def observe_events(
    client: redis.asyncio.Redis, job_id: str, events: AsyncIterator[StreamItem]
) -> AsyncIterator[StreamItem]:
    """Pass a job's events through, observing them for the current request's metrics and log."""
    record = request_log.current()
    if record is None or record.metrics is None:
        async for item in events:
            yield item
        return
    stream = _StreamObserver(record, record.metrics)
    try:
        async for item in events:
            if isinstance(item, Delivery):
                event = item.event
                if isinstance(event, Started):
                    stream.started(client, job_id, event)
                elif isinstance(event, TokenChunk):
                    stream.chunk(event)
                else:
                    stream.ended(event)
            yield item
        await stream.settled()
    finally:
        stream.abandon()


@dataclass
class _StreamObserver:
    record: RequestRecord
    metrics: Metrics
    last_chunk: float | None = None
    tokens: int = 0
    seen_started: bool = False
    queue_wait: asyncio.Task[None] | None = None

    def started(self, client: redis.asyncio.Redis, job_id: str, event: Started) -> None:
        """Record the prompt's tokens and the job's queue wait: the event's, else read from
        the job hash beside the stream (the read's round trip would hold back the first
        token, which follows the Started event)."""
        if self.seen_started:
            return
        self.seen_started = True
        self.record.prompt_tokens = event.prompt_tokens
        self.metrics.prompt_tokens.inc(event.prompt_tokens)
        if event.queue_wait_s is not None:
            self._record_queue_wait(event.queue_wait_s)
        else:
            self.queue_wait = asyncio.create_task(self._observe_queue_wait(client, job_id))

    async def _observe_queue_wait(self, client: redis.asyncio.Redis, job_id: str) -> None:
        wait = await _queue_wait(client, job_id)
        if wait is not None:
            self._record_queue_wait(wait)

    def _record_queue_wait(self, wait: float) -> None:
        self.record.queue_wait_s = wait
        self.metrics.queue_wait.observe(wait)

    async def settled(self) -> None:
        """Wait for the queue wait's read (bounded by its timeout) before the request's log
        line is written."""
        if self.queue_wait is not None:
            await self.queue_wait

    def abandon(self) -> None:
        """The stream ended early (its client left): drop the queue wait's read."""
        if self.queue_wait is not None:
            self.queue_wait.cancel()

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
            served = self.metrics.prompt_tokens_served
            served.labels(source="cache").inc(event.usage.cached_tokens)
            served.labels(source="prefill").inc(
                event.usage.prompt_tokens - event.usage.cached_tokens
            )
        else:
            self.record.job_status = _ERROR_STATUSES.get(event.error_type, JobStatus.FAILED)
            self.record.error_type = event.error_type


async def _queue_wait(client: redis.asyncio.Redis, job_id: str) -> float | None:
    """`started_at - created_at` from the job hash (both Redis `TIME`), or `None`."""
    try:
        async with asyncio.timeout(QUEUE_WAIT_TIMEOUT_S):
            created, started = await client.hmget(
                keys.job(job_id), [JobField.CREATED_AT, JobField.STARTED_AT]
            )
    except (RedisError, OSError, TimeoutError):
        return None
    if created is None or started is None:
        return None
    return max(0.0, float(started) - float(created))
