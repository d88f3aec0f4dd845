"""Webhook delivery: the dispatcher every API process runs, and the Standard Webhooks signature.

A job's delivery is queued by the Lua library in the script that starts the job (`start`) or
ends it (`completed`, any terminal status), when the job asked for that event (`POST /v1/jobs`
with `webhook`, `webhook_events_filter`); a batch's (`completed`) by the transition that ends
the batch (`api.batches.store.transition`), when it was created with a `webhook`.
`api.webhooks.queue` describes the reliable queue. Each API process runs one `Dispatcher`
(`dispatch_webhooks`, started by the app's lifespan) that takes deliveries, up to
`MAX_CONCURRENT_DELIVERIES` at a time, and for each:

1. reads the job's record (or the batch's) and builds the body: the record as
   `GET /v1/jobs/{id}` returns it at the time of the attempt (so a late `start` may already
   show the job finished), or the batch object as `GET /v1/batches/{id}` returns it;
2. checks the target (`api.webhooks.policy`: allow-list, every resolved address) and sends
   the POST to a checked address, with connect/read/write timeouts of
   `TOKENRELAY_WEBHOOK_TIMEOUT_S`, the whole attempt at most twice that, redirects not
   followed, proxies from the environment ignored;
3. settles it: a 2xx answer is a success; any other answer or a network error schedules
   another attempt after `backoff_s` (2 s, 4 s, 8 s, ... by default), up to
   `TOKENRELAY_WEBHOOK_MAX_ATTEMPTS` attempts in all; a target the policy refuses, or a job
   (or batch) whose record has expired, is dropped at once. Drops are logged as warnings.

Signing (Standard Webhooks, as Replicate does): headers `webhook-id` (`msg_<job id>_<event>`,
`msg_<batch id>_completed`; the same on every attempt: dedupe on it, since delivery is at
least once), `webhook-timestamp` (unix seconds of this attempt) and `webhook-signature` (`v1,`
+ base64 of HMAC-SHA256 over `{id}.{timestamp}.{body}`, keyed with the decoded
`TOKENRELAY_WEBHOOK_SECRET`).
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import logging
import math
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from enum import StrEnum
from typing import TypeVar

import httpx
import redis.asyncio
from redis.exceptions import RedisError

from tokenrelay.api.state import AppState
from tokenrelay.api.webhooks.policy import (
    Resolver,
    WebhookRefused,
    pinned_request,
    resolve_host,
    resolve_target,
    webhooks_unavailable,
)
from tokenrelay.api.webhooks.queue import Delivery, WebhookQueue
from tokenrelay.shared.settings import Settings

log = logging.getLogger(__name__)
T = TypeVar("T")

MAX_CONCURRENT_DELIVERIES = 16
MAX_BACKOFF_S = 3600.0
MAX_ADDRESSES_TRIED = 3
TAKE_BLOCK_S = 1
REDIS_RETRY_S = 1.0
SETTLE_TRIES = 5
STOP_TIMEOUT_S = 5.0
USER_AGENT = "tokenrelay-webhooks/0.1"


def signature(key: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """`v1,` + base64(HMAC-SHA256(key, f"{message_id}.{timestamp}.{body}"))."""
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


def signed_headers(key: bytes, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
    return {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": signature(key, message_id, timestamp, body),
    }


def backoff_s(base_s: float, failures: int) -> float:
    """Wait before the next attempt after `failures` failed ones: base, 2 x base, 4 x base, ..."""
    return float(min(base_s * 2 ** (failures - 1), MAX_BACKOFF_S))


class Outcome(StrEnum):
    DELIVERED = "delivered"
    RETRYING = "retrying"
    DROPPED = "dropped"
    NOT_HELD = "not_held"  # another dispatcher took this one for dead and handed it back


class PayloadGone(Exception):
    """A subject's record has expired, has no webhook, or is incomplete: its delivery is
    dropped."""


PayloadLoader = Callable[[str], Awaitable[tuple[str, str]]]
"""The webhook URL and body of one kind of subject (a job, a batch), by id; raises
`PayloadGone`. The features own their records: the dispatcher reads none itself."""


class _Permanent(Exception):
    """This delivery can never succeed: drop it."""


class _Transient(Exception):
    """This attempt failed: try again later."""


class Dispatcher:
    """Takes webhook deliveries from the queue and sends them; see the module docstring."""

    def __init__(
        self,
        client: redis.asyncio.Redis,
        settings: Settings,
        http: httpx.AsyncClient,
        payloads: Mapping[str, PayloadLoader],
        *,
        resolver: Resolver = resolve_host,
        dispatcher_id: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`payloads`: each kind of subject's (`Delivery.kind`) loader of URL and body."""
        key = settings.webhook_key
        if key is None:
            raise ValueError("a webhook dispatcher needs TOKENRELAY_WEBHOOK_SECRET")
        self._key = key
        self._redis = client
        self._payloads = payloads
        self._settings = settings
        self._http = http
        self._resolver = resolver
        self._clock = clock
        dispatcher_id = dispatcher_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex}"
        self.queue = WebhookQueue(client, dispatcher_id, settings.webhook_visibility_timeout_s)
        self._tick_s = min(1.0, settings.webhook_visibility_timeout_s / 3)
        self._fresh_s = settings.webhook_visibility_timeout_s / 2
        self._heartbeat_at = -math.inf  # time.monotonic() of the last heartbeat that landed
        self._registered = asyncio.Event()
        self._slots = asyncio.Semaphore(MAX_CONCURRENT_DELIVERIES)
        self._inflight: set[asyncio.Task[None]] = set()

    async def run(self) -> None:
        """Deliver until cancelled, then hand what is still held back to the queue."""
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._tick_forever())
                group.create_task(self._take_forever())
        finally:
            await self._stop()

    async def handle(self, raw: str) -> Outcome:
        """Make one attempt at a delivery this dispatcher holds, and settle it."""
        try:
            delivery = Delivery.parse(raw)
        except ValueError as exc:
            log.warning("webhook delivery dropped: %s", exc)
            await self._settle(lambda: self.queue.done(raw))
            return Outcome.DROPPED
        try:
            await self._attempt(delivery)
        except _Permanent as exc:
            log.warning("webhook %s dropped: %s", delivery.message_id, exc)
            await self._settle(lambda: self.queue.done(raw))
            return Outcome.DROPPED
        except _Transient as exc:
            return await self._retry(raw, delivery, str(exc))
        except RedisError as exc:
            return await self._retry(raw, delivery, f"Redis: {exc}")
        except Exception as exc:  # a bug must not strand the delivery: retry it like a failure
            log.exception("webhook %s: unexpected error", delivery.message_id)
            return await self._retry(raw, delivery, f"unexpected error: {exc!r}")
        await self._settle(lambda: self.queue.done(raw))
        log.debug("webhook %s delivered", delivery.message_id)
        return Outcome.DELIVERED

    async def _payload(self, delivery: Delivery) -> tuple[str, str]:
        """The webhook URL and the body of the delivery's subject, from its kind's loader."""
        load = self._payloads.get(delivery.kind)
        if load is None:
            raise _Permanent(f"no webhook payload for a {delivery.kind!r}")
        try:
            return await load(delivery.subject_id)
        except PayloadGone as exc:
            raise _Permanent(str(exc)) from None

    async def _attempt(self, delivery: Delivery) -> None:
        url, body = await self._payload(delivery)
        try:
            target, addresses = await resolve_target(url, self._settings, self._resolver)
        except WebhookRefused as exc:
            raise _Permanent(f"`webhook` {exc}") from None
        except OSError as exc:
            raise _Transient(f"could not resolve the webhook's host: {exc}") from None
        payload = body.encode()
        timestamp = int(self._clock())
        headers = signed_headers(self._key, delivery.message_id, timestamp, payload)
        failure = "no address to connect to"
        for address in addresses[:MAX_ADDRESSES_TRIED]:
            request = pinned_request(self._http, target, address, headers, payload)
            try:
                async with asyncio.timeout(2 * self._settings.webhook_timeout_s):
                    response = await self._http.send(request, stream=True)
                    await response.aclose()
            except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
                failure = f"could not connect to {address}: {exc!r}"
                continue
            except (httpx.HTTPError, TimeoutError) as exc:
                raise _Transient(f"{address}: {exc!r}") from None
            if response.is_success:
                return
            raise _Transient(f"the receiver answered HTTP {response.status_code}")
        raise _Transient(failure)

    async def _retry(self, raw: str, delivery: Delivery, reason: str) -> Outcome:
        failures = delivery.attempt + 1
        if failures >= self._settings.webhook_max_attempts:
            log.warning(
                "webhook %s dropped after %d attempts; last: %s",
                delivery.message_id,
                failures,
                reason,
            )
            await self._settle(lambda: self.queue.done(raw))
            return Outcome.DROPPED
        delay_s = backoff_s(self._settings.webhook_backoff_s, failures)
        log.info(
            "webhook %s attempt %d failed (%s); next in %.1f s",
            delivery.message_id,
            failures,
            reason,
            delay_s,
        )
        held = await self._settle(
            lambda: self.queue.retry_later(raw, delivery.next_attempt(), delay_s)
        )
        return Outcome.RETRYING if held else Outcome.NOT_HELD

    async def _settle(self, operation: Callable[[], Awaitable[T]]) -> T:
        """Run a settling Redis operation, retrying through a short outage; a delivery that
        still cannot be settled stays held and is handed back when this dispatcher stops."""
        for attempt in range(SETTLE_TRIES):
            try:
                return await operation()
            except RedisError as exc:
                if attempt == SETTLE_TRIES - 1:
                    raise
                log.warning("webhook settle failed (%s); retrying", exc)
                await asyncio.sleep(REDIS_RETRY_S * 2**attempt)
        raise AssertionError("unreachable")

    async def _tick_forever(self) -> None:
        while True:
            try:
                await self.queue.tick()
                self._heartbeat_at = time.monotonic()
                self._registered.set()
            except RedisError as exc:
                log.warning("webhook dispatcher heartbeat failed: %s", exc)
            await asyncio.sleep(self._tick_s)

    async def _wait_registered(self) -> None:
        """Take nothing unless this dispatcher's heartbeat is surely current: the deliveries
        of a dispatcher that is not registered (not yet, or taken for dead after a long pause)
        could not be recovered if it died."""
        while time.monotonic() - self._heartbeat_at > self._fresh_s:
            self._registered.clear()
            await self._registered.wait()

    async def _take_forever(self) -> None:
        while True:
            await self._slots.acquire()
            try:
                await self._wait_registered()
                raw = await self.queue.take(TAKE_BLOCK_S)
            except RedisError as exc:
                self._slots.release()
                log.warning("webhook dispatcher cannot read its queue: %s", exc)
                await asyncio.sleep(REDIS_RETRY_S)
                continue
            except BaseException:
                self._slots.release()
                raise
            if raw is None:
                self._slots.release()
                continue
            task = asyncio.create_task(self._handle_and_release(raw))
            self._inflight.add(task)
            task.add_done_callback(self._inflight.discard)

    async def _handle_and_release(self, raw: str) -> None:
        try:
            await self.handle(raw)
        except RedisError as exc:
            log.warning(
                "webhook delivery kept in %s until it stops: %s", self.queue.processing, exc
            )
        finally:
            self._slots.release()

    async def _stop(self) -> None:
        for task in self._inflight:
            task.cancel()
        await asyncio.gather(*self._inflight, return_exceptions=True)
        try:
            async with asyncio.timeout(STOP_TIMEOUT_S):
                released = await self.queue.release()
        except (RedisError, TimeoutError) as exc:
            log.warning("webhook dispatcher could not hand back its deliveries: %s", exc)
            return
        if released:
            log.info("webhook dispatcher handed %d deliveries back to the queue", released)


async def dispatch_webhooks(state: AppState, payloads: Mapping[str, PayloadLoader]) -> None:
    """The lifespan task: run a dispatcher when this process can send webhooks."""
    unavailable = webhooks_unavailable(state.settings)
    if unavailable is not None:
        log.info("webhook dispatcher not started: %s", unavailable)
        return
    timeout = httpx.Timeout(state.settings.webhook_timeout_s)
    limits = httpx.Limits(max_connections=MAX_CONCURRENT_DELIVERIES)
    async with httpx.AsyncClient(
        timeout=timeout, limits=limits, follow_redirects=False, trust_env=False
    ) as http:
        await Dispatcher(state.redis, state.settings, http, payloads).run()
