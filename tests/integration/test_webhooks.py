"""Webhooks: the signature, the URL and address policy, the Lua transitions that queue
deliveries, the dispatcher's reliable queue and retries, and end to end through real processes
with a local receiver."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace

import httpx
import pydantic
import pytest
import redis
import redis.asyncio

from tests.support.webhook_receiver import (
    SECRET,
    Receiver,
    assert_signed,
    independent_signature,
    nothing_left,
)
from tokenrelay.api.app import build_state, webhook_payloads
from tokenrelay.api.batches.models import Batch, BatchField, BatchStatus
from tokenrelay.api.batches.store import transition
from tokenrelay.api.jobs.request import JobRequest
from tokenrelay.api.state import AppState
from tokenrelay.api.webhooks.dispatcher import Dispatcher, Outcome, backoff_s, signature
from tokenrelay.api.webhooks.policy import (
    IPAddress,
    Resolver,
    WebhookRefused,
    WebhookTarget,
    address_refusal,
    check_submission,
    host_allowed,
    pinned_request,
    resolve_target,
)
from tokenrelay.api.webhooks.queue import Delivery, WebhookQueue
from tokenrelay.shared.errors import InvalidRequest
from tokenrelay.shared.events import Done, Started, Usage
from tokenrelay.shared.jobs import JobRecord
from tokenrelay.shared.redis import job_scripts, keys, scripts
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings

PUBLIC = ipaddress.ip_address("93.184.216.34")
HOOK_URL = "https://hooks.example.com/tokenrelay"


# --- signing and settings ---------------------------------------------------------------


def test_signature_matches_the_standard_webhooks_example() -> None:
    key = Settings(webhook_secret="whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").webhook_key
    assert key is not None
    sent = signature(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
    assert sent == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


def test_signature_verifies_with_an_independent_hmac() -> None:
    key = Settings(webhook_secret=SECRET).webhook_key
    assert key is not None
    body = json.dumps({"text": "写一首诗 🌊\n"}, ensure_ascii=False).encode()
    sent = signature(key, "msg_abc_start", 1700000000, body)
    assert sent == independent_signature(SECRET, "msg_abc_start", "1700000000", body)
    assert sent != independent_signature(SECRET, "msg_abc_start", "1700000001", body)


@pytest.mark.parametrize(
    "secret",
    [
        "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",  # no prefix
        "whsec_not base64!",
        "whsec_" + base64.b64encode(b"short").decode(),
        "whsec_" + base64.b64encode(bytes(65)).decode(),
    ],
)
def test_webhook_secret_must_be_whsec_and_base64_of_24_to_64_bytes(secret: str) -> None:
    with pytest.raises(pydantic.ValidationError, match="whsec_"):
        Settings(webhook_secret=secret)


def test_empty_webhook_secret_means_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOKENRELAY_WEBHOOK_SECRET", "")
    monkeypatch.setenv("TOKENRELAY_WEBHOOK_ALLOWED_HOSTS", " Hooks.Example.COM., .example.org ,")
    settings = Settings()
    assert settings.webhook_secret is None and settings.webhook_key is None
    assert settings.webhook_allowed_hosts == ["hooks.example.com", ".example.org"]
    assert "whsec" not in repr(Settings(webhook_secret=SECRET))


def test_backoff_doubles_from_the_base_and_is_capped() -> None:
    assert [backoff_s(2.0, n) for n in (1, 2, 3, 4)] == [2.0, 4.0, 8.0, 16.0]
    assert backoff_s(2.0, 40) == 3600.0


# --- URL, host and address policy ------------------------------------------------------


@pytest.mark.parametrize(
    ("host", "allowed"),
    [
        ("hooks.example.com", True),
        ("HOOKS.example.com.", True),
        ("a.example.org", True),
        ("b.a.example.org", True),
        ("example.org", False),  # a suffix entry allows subdomains only
        ("badexample.org", False),
        ("example.com", False),
        ("hooks.example.com.evil.net", False),
        ("127.0.0.1", True),
        ("127.0.0.2", False),
    ],
)
def test_allow_list_has_exact_names_and_dot_suffixes(host: str, allowed: bool) -> None:
    assert host_allowed(host, ["hooks.example.com", ".example.org", "127.0.0.1"]) is allowed


@pytest.mark.parametrize(
    ("address", "refused_by_default", "refused_when_private_allowed"),
    [
        ("93.184.216.34", False, False),
        ("2606:4700::1111", False, False),
        ("127.0.0.1", True, False),
        ("::1", True, False),
        ("10.1.2.3", True, False),
        ("172.16.0.1", True, False),
        ("192.168.1.1", True, False),
        ("169.254.169.254", True, False),  # cloud metadata: link-local
        ("fe80::1", True, False),
        ("fd00::1", True, False),
        ("100.64.0.1", True, False),  # shared address space (CGNAT)
        ("240.0.0.1", True, False),  # reserved
        ("::ffff:127.0.0.1", True, False),  # IPv4-mapped loopback
        ("::ffff:93.184.216.34", False, False),
        ("2002:a00:1::1", True, False),  # 6to4 of 10.0.0.1
        ("0.0.0.0", True, True),
        ("::", True, True),
        ("224.0.0.1", True, True),
        ("ff02::1", True, True),
    ],
)
def test_private_loopback_and_link_local_addresses_are_refused_unless_allowed(
    address: str, refused_by_default: bool, refused_when_private_allowed: bool
) -> None:
    ip = ipaddress.ip_address(address)
    assert (address_refusal(ip, allow_private=False) is not None) is refused_by_default
    assert (address_refusal(ip, allow_private=True) is not None) is refused_when_private_allowed


def webhook_settings(**overrides: object) -> Settings:
    values: dict[str, object] = {
        "webhook_secret": SECRET,
        "webhook_allowed_hosts": ["hooks.example.com", ".example.org", "10.0.0.1", "8.8.8.8"],
    }
    values.update(overrides)
    return Settings.model_validate(values)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://hooks.example.com/x", "http or https"),
        ("hooks.example.com/x", "http or https"),
        ("https:///x", "must name a host"),
        ("https://a..example.org/x", "not a valid host name"),
        ("https://%41.example.org/x", "not a valid host name"),
        ("https://hooks.example.com:99999/x", "port must be"),
        ("https://user:pw@hooks.example.com/x", "credentials"),
        ("https://hooks.example.com/x#frag", "fragment"),
        ("https://other.example.com/x", "allow-list"),
        ("http://10.0.0.1/x", "private address"),
        ("https://hooks.example.com/" + "a" * 2100, "at most 2048"),
    ],
)
def test_submission_refuses_bad_webhook_urls_with_a_400_naming_webhook(
    url: str, message: str
) -> None:
    with pytest.raises(InvalidRequest, match=message) as refused:
        check_submission(webhook_settings(), url, None)
    assert refused.value.param == "webhook"


def test_submission_needs_an_allow_list_and_a_secret() -> None:
    with pytest.raises(InvalidRequest, match="TOKENRELAY_WEBHOOK_ALLOWED_HOSTS"):
        check_submission(Settings(webhook_secret=SECRET), HOOK_URL, None)
    with pytest.raises(InvalidRequest, match="TOKENRELAY_WEBHOOK_SECRET"):
        check_submission(Settings(webhook_allowed_hosts=["hooks.example.com"]), HOOK_URL, None)


def test_submission_events_filter_defaults_to_both_and_must_not_be_empty() -> None:
    settings = webhook_settings()
    assert check_submission(settings, HOOK_URL, None).events == ("start", "completed")
    assert check_submission(settings, HOOK_URL, ["completed"]).events == ("completed",)
    with pytest.raises(InvalidRequest) as refused:
        check_submission(settings, HOOK_URL, [])
    assert refused.value.param == "webhook_events_filter"
    lonely = JobRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "hi"}], "webhook_events_filter": []}
    )
    with pytest.raises(InvalidRequest, match="needs a `webhook`"):
        lonely.webhook_target(settings)
    private_ok = webhook_settings(webhook_allow_private=True)
    assert check_submission(private_ok, "http://10.0.0.1/x", None).url == "http://10.0.0.1/x"


def resolver_for(*addresses: str) -> Resolver:
    async def resolve(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address(a) for a in addresses]

    return resolve


async def test_delivery_checks_every_address_the_host_resolves_to() -> None:
    settings = webhook_settings()
    url, addresses = await resolve_target(HOOK_URL, settings, resolver_for("93.184.216.34"))
    assert url.host == "hooks.example.com" and addresses == [PUBLIC]
    with pytest.raises(WebhookRefused, match=r"10\.0\.0\.7, a private address"):
        await resolve_target(HOOK_URL, settings, resolver_for("93.184.216.34", "10.0.0.7"))
    with pytest.raises(WebhookRefused, match="allow-list"):
        await resolve_target("https://gone.example.net/", settings, resolver_for("8.8.8.8"))


def test_pinned_request_connects_to_the_checked_address_keeping_host_and_tls_name() -> None:
    client = httpx.AsyncClient()
    secure = pinned_request(
        client, httpx.URL("https://Hooks.Example.com:8443/p?q=1"), PUBLIC, {"a": "b"}, b"{}"
    )
    assert str(secure.url) == "https://93.184.216.34:8443/p?q=1"
    assert secure.headers["host"] == "hooks.example.com:8443"
    assert secure.extensions["sni_hostname"] == "hooks.example.com"
    assert secure.headers["a"] == "b" and secure.content == b"{}"
    plain = pinned_request(
        client,
        httpx.URL("http://hooks.example.com/p"),
        ipaddress.ip_address("2606:4700::1"),
        {},
        b"",
    )
    assert str(plain.url) == "http://[2606:4700::1]/p"
    assert plain.headers["host"] == "hooks.example.com"
    assert "sni_hostname" not in plain.extensions


# --- the Lua transitions queue deliveries -----------------------------------------------


@pytest.fixture
def run(sync_redis: redis.Redis) -> SyncScripts:
    return SyncScripts(sync_redis)


def admit_with_webhook(
    run: SyncScripts,
    settings: Settings,
    sync_redis: redis.Redis,
    job_id: str,
    events: tuple[str, ...] | None = ("start", "completed"),
    url: str = HOOK_URL,
) -> None:
    job_scripts.check_admitted(run.run(job_scripts.admit(settings, job_id, "owner", "m")))
    if events is not None:
        sync_redis.hset(keys.job(job_id), mapping=WebhookTarget(url, events).hash_fields())


def start(run: SyncScripts, settings: Settings, job_id: str) -> object:
    return run.run(
        job_scripts.start(settings, job_id, "w1", Started(worker="w1", prompt_tokens=3).to_wire())
    )


def succeed(run: SyncScripts, settings: Settings, job_id: str) -> int:
    usage = Usage(prompt_tokens=3, completion_tokens=2, total_tokens=5)
    fields: dict[str, scripts.Arg] = {"finish_reason": "stop", "prompt_tokens": 3}
    fields["completion_tokens"] = 2
    done = Done(finish_reason="stop", usage=usage).to_wire()
    return int(run.run(job_scripts.finish(settings, job_id, "succeeded", fields, done)))


def queued(sync_redis: redis.Redis) -> list[Delivery]:
    """Deliveries waiting, oldest first."""
    raws = sync_redis.lrange(keys.webhook_deliveries(), 0, -1)
    return [Delivery.parse(raw) for raw in reversed(raws)]


def test_start_and_finish_queue_their_deliveries_exactly_once(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    admit_with_webhook(run, settings, sync_redis, "j1")
    assert queued(sync_redis) == []
    assert start(run, settings, "j1") == "running"
    assert queued(sync_redis) == [Delivery("j1", "start", 0)]
    assert succeed(run, settings, "j1") == 1
    assert succeed(run, settings, "j1") == 0  # already terminal: no second delivery
    assert queued(sync_redis) == [Delivery("j1", "start"), Delivery("j1", "completed")]


def test_the_events_filter_and_jobs_without_webhooks(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis
) -> None:
    admit_with_webhook(run, settings, sync_redis, "only-completed", events=("completed",))
    admit_with_webhook(run, settings, sync_redis, "no-webhook", events=None)
    for job_id in ("only-completed", "no-webhook"):
        start(run, settings, job_id)
        succeed(run, settings, job_id)
    assert queued(sync_redis) == [Delivery("only-completed", "completed")]


def test_every_terminal_path_queues_completed(
    run: SyncScripts, redis_url: str, sync_redis: redis.Redis
) -> None:
    settings = Settings(redis_url=redis_url, max_inflight=10)
    admit_with_webhook(run, settings, sync_redis, "cancelled", events=("completed",))
    assert run.run(job_scripts.cancel(settings, "cancelled")) == "cancelled"
    admit_with_webhook(run, settings, sync_redis, "lost", events=("completed",))
    start(run, settings, "lost")
    admit_with_webhook(run, settings, sync_redis, "late", events=("completed",))
    sync_redis.zadd(keys.leases(), {"lost": 0, "late": 0})
    assert run.run(job_scripts.reap(settings)) == ["lost"]
    deliveries = queued(sync_redis)
    assert sorted(d.subject_id for d in deliveries) == ["cancelled", "late", "lost"]
    assert {d.event for d in deliveries} == {"completed"}
    statuses = [sync_redis.hget(keys.job(j), "status") for j in ("cancelled", "lost", "late")]
    assert statuses == ["cancelled", "failed", "expired"]


# --- the dispatcher ---------------------------------------------------------------------


@dataclass
class FakeReceiver:
    """An httpx handler that answers `statuses` in turn (then 204) and keeps the requests."""

    statuses: list[int] = field(default_factory=list)
    requests: list[httpx.Request] = field(default_factory=list)

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(self.statuses.pop(0) if self.statuses else 204)


@pytest.fixture
def hook_settings(redis_url: str) -> Settings:
    return webhook_settings(
        redis_url=redis_url, max_inflight=10, webhook_backoff_s=10, webhook_max_attempts=3
    )


def make_dispatcher(
    client: redis.asyncio.Redis,
    settings: Settings,
    receiver: FakeReceiver,
    resolver: Resolver | None = None,
) -> Dispatcher:
    http = httpx.AsyncClient(transport=httpx.MockTransport(receiver))
    return Dispatcher(
        client,
        settings,
        http,
        webhook_payloads(client, client),
        resolver=resolver or resolver_for(str(PUBLIC)),
        dispatcher_id="d1",
    )


def finished_job(
    run: SyncScripts, settings: Settings, sync_redis: redis.Redis, job_id: str, **kw: object
) -> None:
    admit_with_webhook(run, settings, sync_redis, job_id, **kw)  # type: ignore[arg-type]
    start(run, settings, job_id)
    succeed(run, settings, job_id)


def redis_now_ms(sync_redis: redis.Redis) -> int:
    seconds, micros = sync_redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


async def test_a_delivery_is_the_signed_record_and_is_settled(
    run: SyncScripts,
    hook_settings: Settings,
    sync_redis: redis.Redis,
    async_redis: redis.asyncio.Redis,
) -> None:
    finished_job(run, hook_settings, sync_redis, "j1")
    receiver = FakeReceiver()
    dispatcher = make_dispatcher(async_redis, hook_settings, receiver)
    await dispatcher.queue.tick()
    for _event in ("start", "completed"):
        raw = await dispatcher.queue.take(1)
        assert raw is not None
        assert await dispatcher.handle(raw) is Outcome.DELIVERED
    assert nothing_left(sync_redis)
    start_request, completed_request = receiver.requests
    assert start_request.headers["webhook-id"] == "msg_j1_start"
    assert completed_request.headers["webhook-id"] == "msg_j1_completed"
    fields = sync_redis.hgetall(keys.job("j1"))
    record = JobRecord.from_redis("j1", fields, sync_redis.get(keys.job_text("j1")) or "")
    for request in receiver.requests:
        assert request.url.host == str(PUBLIC)
        assert request.headers["host"] == "hooks.example.com"
        assert request.extensions["sni_hostname"] == "hooks.example.com"
        assert request.headers["content-type"] == "application/json"
        assert_signed(dict(request.headers), request.content)
        assert JobRecord.model_validate_json(request.content) == record


async def test_a_failing_receiver_is_retried_with_backoff_and_the_same_webhook_id(
    run: SyncScripts,
    hook_settings: Settings,
    sync_redis: redis.Redis,
    async_redis: redis.asyncio.Redis,
) -> None:
    finished_job(run, hook_settings, sync_redis, "j2", events=("completed",))
    receiver = FakeReceiver(statuses=[500, 302])  # a redirect is not followed: a failure
    dispatcher = make_dispatcher(async_redis, hook_settings, receiver)
    await dispatcher.queue.tick()
    for failures, expected_delay_ms in ((1, 10_000), (2, 20_000)):
        raw = await dispatcher.queue.take(1)
        assert raw is not None
        assert await dispatcher.handle(raw) is Outcome.RETRYING
        [(member, due_ms)] = sync_redis.zrange(keys.webhook_retries(), 0, -1, withscores=True)
        assert Delivery.parse(member) == Delivery("j2", "completed", failures)
        assert abs(due_ms - redis_now_ms(sync_redis) - expected_delay_ms) < 2_000
        assert await dispatcher.queue.tick() == (0, 0)  # not due yet
        sync_redis.zadd(keys.webhook_retries(), {member: 0}, xx=True)  # the clock jumps ahead
        assert await dispatcher.queue.tick() == (1, 0)
    raw = await dispatcher.queue.take(1)
    assert raw is not None
    assert await dispatcher.handle(raw) is Outcome.DELIVERED
    assert nothing_left(sync_redis)
    assert len(receiver.requests) == 3
    assert {r.headers["webhook-id"] for r in receiver.requests} == {"msg_j2_completed"}
    for request in receiver.requests:
        assert_signed(dict(request.headers), request.content)


async def test_a_delivery_is_dropped_after_max_attempts(
    run: SyncScripts,
    hook_settings: Settings,
    sync_redis: redis.Redis,
    async_redis: redis.asyncio.Redis,
) -> None:
    settings = hook_settings.model_copy(update={"webhook_max_attempts": 2})
    finished_job(run, settings, sync_redis, "j3", events=("completed",))
    receiver = FakeReceiver(statuses=[503, 503, 503])
    dispatcher = make_dispatcher(async_redis, settings, receiver)
    await dispatcher.queue.tick()
    outcomes = []
    for _attempt in range(2):
        raw = await dispatcher.queue.take(1)
        assert raw is not None
        outcomes.append(await dispatcher.handle(raw))
        due_now = {member: 0 for member in sync_redis.zrange(keys.webhook_retries(), 0, -1)}
        if due_now:
            sync_redis.zadd(keys.webhook_retries(), due_now)
        await dispatcher.queue.tick()
    assert outcomes == [Outcome.RETRYING, Outcome.DROPPED]
    assert len(receiver.requests) == 2
    assert nothing_left(sync_redis)


async def test_a_refused_target_is_dropped_without_a_request_and_dns_failure_retried(
    run: SyncScripts,
    hook_settings: Settings,
    sync_redis: redis.Redis,
    async_redis: redis.asyncio.Redis,
) -> None:
    finished_job(run, hook_settings, sync_redis, "rebound", events=("completed",))
    receiver = FakeReceiver()
    rebound = make_dispatcher(async_redis, hook_settings, receiver, resolver_for("127.0.0.1"))
    await rebound.queue.tick()
    raw = await rebound.queue.take(1)
    assert raw is not None
    assert await rebound.handle(raw) is Outcome.DROPPED

    async def no_dns(host: str, port: int) -> list[IPAddress]:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    finished_job(run, hook_settings, sync_redis, "no-dns", events=("completed",))
    unresolved = make_dispatcher(async_redis, hook_settings, receiver, no_dns)
    raw = await unresolved.queue.take(1)
    assert raw is not None
    assert await unresolved.handle(raw) is Outcome.RETRYING
    assert receiver.requests == []


async def test_deliveries_of_a_dead_dispatcher_are_recovered_after_the_visibility_timeout(
    async_redis: redis.asyncio.Redis, sync_redis: redis.Redis
) -> None:
    record = Delivery("j4", "completed").to_json()
    await async_redis.lpush(keys.webhook_deliveries(), record)
    dead = WebhookQueue(async_redis, "dead", visibility_timeout_s=30)
    live = WebhookQueue(async_redis, "live", visibility_timeout_s=30)
    await dead.tick()
    assert await dead.take(1) == record
    assert await live.tick() == (0, 0)  # the dead one's heartbeat has not run out yet
    assert sync_redis.lrange(keys.webhook_processing("dead"), 0, -1) == [record]
    sync_redis.zadd(keys.webhook_dispatchers(), {"dead": 0})  # 30 s pass without a heartbeat
    assert await live.tick() == (0, 1)
    assert sync_redis.lrange(keys.webhook_deliveries(), 0, -1) == [record]
    assert sync_redis.zrange(keys.webhook_dispatchers(), 0, -1) == ["live"]
    # The dead one wakes up and fails its attempt: the record is not scheduled a second time.
    assert await dead.retry_later(record, Delivery("j4", "completed", 1), 1.0) is False
    assert sync_redis.zcard(keys.webhook_retries()) == 0


async def test_a_stopping_dispatcher_hands_its_deliveries_back(
    async_redis: redis.asyncio.Redis, sync_redis: redis.Redis
) -> None:
    record = Delivery("j5", "start").to_json()
    await async_redis.lpush(keys.webhook_deliveries(), record)
    stopping = WebhookQueue(async_redis, "stopping", visibility_timeout_s=30)
    await stopping.tick()
    assert await stopping.take(1) == record
    assert await stopping.release() == 1
    assert sync_redis.lrange(keys.webhook_deliveries(), 0, -1) == [record]
    assert sync_redis.zcard(keys.webhook_dispatchers()) == 0


# --- a real receiver -------------------------------------------------------------------


async def test_the_dispatcher_loop_delivers_through_a_pinned_address(
    run: SyncScripts,
    redis_url: str,
    sync_redis: redis.Redis,
    async_redis: redis.asyncio.Redis,
    receiver: Receiver,
) -> None:
    settings = webhook_settings(
        redis_url=redis_url, webhook_allowed_hosts=["hooks.test"], webhook_allow_private=True
    )
    url = f"http://hooks.test:{receiver.port}/hook"  # resolvable only by the fake resolver
    finished_job(run, settings, sync_redis, "j6", events=("completed",), url=url)
    async with httpx.AsyncClient(trust_env=False, timeout=5) as http:
        dispatcher = Dispatcher(
            async_redis,
            settings,
            http,
            webhook_payloads(async_redis, async_redis),
            resolver=resolver_for("127.0.0.1"),
            dispatcher_id="loop",
        )
        task = asyncio.create_task(dispatcher.run())
        got = await asyncio.to_thread(receiver.next, 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert got.path == "/hook"
    assert got.headers["host"] == f"hooks.test:{receiver.port}"
    assert got.headers["webhook-id"] == "msg_j6_completed"
    assert_signed(got.headers, got.body)
    assert sync_redis.zcard(keys.webhook_dispatchers()) == 0  # deregistered on stop


# --- the HTTP route, in process ---------------------------------------------------------


def test_jobs_route_refuses_webhooks_until_configured_and_stores_a_valid_one(
    redis_url: str, sync_redis: redis.Redis
) -> None:
    from fastapi.testclient import TestClient

    from tokenrelay.api.app import create_app

    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "webhook": HOOK_URL}
    with TestClient(create_app(Settings(redis_url=redis_url, served_model_name="m"))) as client:
        refused = client.post("/v1/jobs", json=body)
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == "webhook"
        assert "TOKENRELAY_WEBHOOK_ALLOWED_HOSTS" in refused.json()["error"]["message"]
    settings = webhook_settings(redis_url=redis_url, served_model_name="m")
    with TestClient(create_app(settings)) as client:
        bad = client.post("/v1/jobs", json=body | {"webhook": "http://169.254.169.254/latest"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "webhook"
        wrong_event = client.post("/v1/jobs", json=body | {"webhook_events_filter": ["output"]})
        assert wrong_event.status_code == 400
        created = client.post("/v1/jobs", json=body | {"webhook_events_filter": ["completed"]})
        assert created.status_code == 202
        job_id = created.json()["id"]
        read = client.get(f"/v1/jobs/{job_id}").json()
        plain = client.post("/v1/jobs", json={k: v for k, v in body.items() if k != "webhook"})
    for record in (created.json(), read):
        assert record["webhook"] == HOOK_URL
        assert record["webhook_events_filter"] == ["completed"]
    assert plain.json()["webhook"] is None and plain.json()["webhook_events_filter"] is None
    assert sync_redis.hmget(keys.job(job_id), "webhook", "webhook_events") == [
        HOOK_URL,
        "completed",
    ]


# --- batch webhooks, in process ---------------------------------------------------------

BATCH_ID = "batch_" + "b" * 32


def batch_hash(sync_redis: redis.Redis, batch_id: str, webhook: str | None = HOOK_URL) -> None:
    """A running batch's record, as `api.batches.store` writes one."""
    fields = {
        BatchField.OWNER: "anonymous",
        BatchField.STATUS: BatchStatus.IN_PROGRESS,
        BatchField.ENDPOINT: "/v1/chat/completions",
        BatchField.INPUT_FILE_ID: "file-" + "f" * 32,
        BatchField.TOTAL: 2,
        BatchField.COMPLETED: 1,
        BatchField.FAILED: 1,
        "created_at": 1_700_000_000,
    }
    if webhook is not None:
        fields[BatchField.WEBHOOK] = webhook
    sync_redis.hset(keys.batch(batch_id), mapping=fields)


@pytest.fixture
async def app_states(hook_settings: Settings) -> AsyncIterator[tuple[AppState, AppState]]:
    """Two API processes' long-lived state against the same Redis."""
    first, second = build_state(hook_settings), build_state(hook_settings)
    yield first, second
    await first.close()
    await second.close()


def test_a_batch_delivery_record_round_trips_and_is_told_from_a_jobs() -> None:
    batch = Delivery(BATCH_ID, "completed", kind="batch")
    assert json.loads(batch.to_json()) == {"batch_id": BATCH_ID, "event": "completed", "attempt": 0}
    assert Delivery.parse(batch.to_json()) == batch
    assert Delivery.parse(batch.next_attempt().to_json()) == replace(batch, attempt=1)
    assert batch.message_id == f"msg_{BATCH_ID}_completed"
    job = Delivery.parse('{"job_id": "j1", "event": "start", "attempt": 2}')
    assert (job.kind, job.subject_id, job.attempt) == ("job", "j1", 2)
    for raw in ('{"job_id": "j", "batch_id": "b", "event": "e", "attempt": 0}', '{"event": "e"}'):
        with pytest.raises(ValueError, match="not a delivery record"):
            Delivery.parse(raw)


async def test_ending_a_batch_queues_one_delivery_of_the_signed_batch_object(
    app_states: tuple[AppState, AppState],
    hook_settings: Settings,
    sync_redis: redis.Redis,
    async_redis: redis.asyncio.Redis,
) -> None:
    state, _ = app_states
    batch_hash(sync_redis, BATCH_ID)
    moved = await transition(
        state, BATCH_ID, (BatchStatus.IN_PROGRESS,), BatchStatus.FINALIZING, {"finalizing_at": 1}
    )
    assert moved and queued(sync_redis) == []  # not terminal: nothing to deliver yet
    ended = await transition(
        state, BATCH_ID, (BatchStatus.FINALIZING,), BatchStatus.COMPLETED, {"completed_at": 2}
    )
    assert ended
    assert queued(sync_redis) == [Delivery(BATCH_ID, "completed", kind="batch")]
    receiver = FakeReceiver()
    dispatcher = make_dispatcher(async_redis, hook_settings, receiver)
    await dispatcher.queue.tick()
    raw = await dispatcher.queue.take(1)
    assert raw is not None
    assert await dispatcher.handle(raw) is Outcome.DELIVERED
    assert nothing_left(sync_redis)
    [request] = receiver.requests
    assert request.headers["webhook-id"] == f"msg_{BATCH_ID}_completed"
    assert request.headers["host"] == "hooks.example.com"
    assert_signed(dict(request.headers), request.content)
    sent = Batch.model_validate_json(request.content)
    assert sent == Batch.from_redis(BATCH_ID, sync_redis.hgetall(keys.batch(BATCH_ID)))
    assert (sent.status, sent.completed_at, sent.webhook) == ("completed", 2, HOOK_URL)
    assert sent.request_counts.model_dump() == {"total": 2, "completed": 1, "failed": 1}


async def test_two_processes_racing_to_end_a_batch_queue_exactly_one_delivery(
    app_states: tuple[AppState, AppState], sync_redis: redis.Redis
) -> None:
    """Each round, two API processes end the same batch at once (one as completed, one as
    expired): the WATCH lets exactly one win, and only the winner's delivery is queued."""
    first, second = app_states
    rounds = [f"batch_{i:032x}" for i in range(20)]
    for batch_id in rounds:
        batch_hash(sync_redis, batch_id)
        won = await asyncio.gather(
            transition(first, batch_id, (BatchStatus.IN_PROGRESS,), BatchStatus.COMPLETED),
            transition(second, batch_id, (BatchStatus.IN_PROGRESS,), BatchStatus.EXPIRED),
        )
        assert sorted(won) == [False, True]
        status = sync_redis.hget(keys.batch(batch_id), BatchField.STATUS)
        assert status == (BatchStatus.COMPLETED if won[0] else BatchStatus.EXPIRED)
    deliveries = queued(sync_redis)
    assert [d.subject_id for d in deliveries] == rounds
    assert {(d.kind, d.event) for d in deliveries} == {("batch", "completed")}


async def test_a_batch_without_a_webhook_or_whose_record_expired_sends_nothing(
    app_states: tuple[AppState, AppState],
    hook_settings: Settings,
    sync_redis: redis.Redis,
    async_redis: redis.asyncio.Redis,
) -> None:
    state, _ = app_states
    batch_hash(sync_redis, BATCH_ID, webhook=None)
    assert await transition(state, BATCH_ID, (BatchStatus.IN_PROGRESS,), BatchStatus.CANCELLED)
    assert queued(sync_redis) == []
    batch_hash(sync_redis, "batch_" + "c" * 32)
    assert await transition(
        state, "batch_" + "c" * 32, (BatchStatus.IN_PROGRESS,), BatchStatus.FAILED
    )
    sync_redis.delete(keys.batch("batch_" + "c" * 32))  # gone before the dispatcher took it
    receiver = FakeReceiver()
    dispatcher = make_dispatcher(async_redis, hook_settings, receiver)
    await dispatcher.queue.tick()
    raw = await dispatcher.queue.take(1)
    assert raw is not None
    assert await dispatcher.handle(raw) is Outcome.DROPPED
    assert receiver.requests == [] and nothing_left(sync_redis)


def test_batches_route_refuses_a_bad_webhook_with_a_400_naming_it(redis_url: str) -> None:
    from fastapi.testclient import TestClient

    from tokenrelay.api.app import create_app

    body = {
        "input_file_id": "file-" + "0" * 32,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
        "webhook": HOOK_URL,
    }
    with TestClient(create_app(Settings(redis_url=redis_url, served_model_name="m"))) as client:
        off = client.post("/v1/batches", json=body)
        assert off.status_code == 400
        assert off.json()["error"]["param"] == "webhook"
        assert "TOKENRELAY_WEBHOOK_ALLOWED_HOSTS" in off.json()["error"]["message"]
    settings = webhook_settings(redis_url=redis_url, served_model_name="m")
    with TestClient(create_app(settings)) as client:
        for url, reason in [
            ("http://169.254.169.254/latest", "allow-list"),
            ("http://10.0.0.1/x", "private address"),
            ("ftp://hooks.example.com/x", "http or https"),
        ]:
            refused = client.post("/v1/batches", json=body | {"webhook": url})
            assert refused.status_code == 400
            error = refused.json()["error"]
            assert (error["type"], error["param"]) == ("invalid_request_error", "webhook")
            assert reason in error["message"]
        filtered = client.post("/v1/batches", json=body | {"webhook_events_filter": ["start"]})
        assert filtered.status_code == 400
        assert filtered.json()["error"]["param"] == "webhook_events_filter"
        # a good webhook passes its check: the unknown file is what is refused
        unknown_file = client.post("/v1/batches", json=body)
        assert unknown_file.status_code == 404
        assert unknown_file.json()["error"]["code"] == "file_not_found"
