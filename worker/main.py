"""`tokenrelay worker`: load the model once, then serve RQ jobs in this process."""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial

import redis
from rq.exceptions import StopRequested

from tokenrelay.shared import log_config
from tokenrelay.shared.redis import connect as redis_connect
from tokenrelay.shared.redis import server_version as redis_version
from tokenrelay.shared.redis.model_limits import LimitsPublisher
from tokenrelay.shared.redis.rq_jobs import GENERATE_FUNCTION
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.settings import Settings
from tokenrelay.worker.active_jobs import ActiveJobs, StopReason
from tokenrelay.worker.batcher import Batcher
from tokenrelay.worker.engines.gguf import local_model
from tokenrelay.worker.engines.protocol import Engine, ModelLoadError
from tokenrelay.worker.engines.synthetic_engine import SyntheticEngine
from tokenrelay.worker.failover_guard import FailoverGuard
from tokenrelay.worker.lease_keeper import LeaseKeeper
from tokenrelay.worker.rq_worker import (
    DEQUEUE_WAIT_S,
    ConcurrentWorker,
    StartSignal,
    build_worker,
)
from tokenrelay.worker.runner import JobRunner

log = logging.getLogger(__name__)

EXIT_MODEL_UNAVAILABLE = 2
EXIT_REDIS_TOO_OLD = 3
_RECONNECT_BACKOFF_S = 1.0
_POOL_WAIT_S = 5.0
_SOCKET_TIMEOUTS = {"socket_timeout": DEQUEUE_WAIT_S + 10.0, "socket_connect_timeout": 5.0}
"""Every call of the worker fails instead of blocking for ever when the server stops
answering (a frozen or partitioned primary never closes the connection), and the retry
reconnects to the primary the sentinels name; 10 s above RQ's dequeue wait, as RQ sets it."""


def build_engine(settings: Settings, arrivals: threading.Event, model: Callable[[], str]) -> Engine:
    """The engine `settings` name; `arrivals` is the batcher's (`Batcher.submit` sets it);
    `model` gives the directory or hub id to load (it may convert or build one first)."""
    if settings.engine == "synthetic":
        log.warning("synthetic engine: tokens are placeholders, for benchmarks only")
        return SyntheticEngine(
            settings.synthetic_tokens_per_s,
            settings.synthetic_first_token_ms,
            settings.synthetic_lockstep,
            arrivals,
        )
    model_name = model()
    if settings.engine == "vllm":
        from tokenrelay.worker.engines.vllm_engine import VllmEngine

        return VllmEngine(
            model_name,
            settings.device,
            settings.dtype,
            settings.worker_max_prefill_tokens,
            settings.worker_concurrency,
            settings.vllm_cpu_max_model_len,
        )
    from tokenrelay.worker.engines.transformers_engine import TransformersEngine

    return TransformersEngine(
        model_name,
        settings.device,
        settings.dtype,
        settings.worker_max_prefill_tokens,
        prefix_cache_bytes=settings.prefix_cache_bytes,
        prefix_block_tokens=settings.prefix_cache_block_tokens,
    )


def _deregister(worker: ConcurrentWorker) -> bool:
    """Mark RQ's record of a work loop that ended abnormally dead, so the next loop may
    register under the same name (RQ refuses a name whose record looks alive)."""
    try:
        worker.register_death()
    except redis.RedisError as exc:
        log.warning("could not deregister from RQ yet: %r", exc)
        return False
    return True


def run_worker(settings: Settings, *, demo: str | None = None) -> int:
    """Run until stopped (SIGTERM/SIGINT: finish the current job, then exit 0); `demo`, one
    of `devmodels.demo.DEMO_CHOICES`, serves the offline demo model."""
    log_config.configure(settings.log_level, settings.log_format)
    connector = redis_connect.RedisConnector(settings)
    try:
        with connector.sync_client() as client:
            redis_version.check_sync(client, settings)
    except redis_version.RedisTooOld as exc:
        print(f"tokenrelay worker: {exc}", file=sys.stderr)
        return EXIT_REDIS_TOO_OLD
    model: Callable[[], str] = partial(local_model, settings.model, settings.cache_dir)
    if demo:
        from tokenrelay.worker.devmodels.demo import NOT_INSTALLED, DemoModel

        try:
            chosen = DemoModel.choose(demo)
        except ModelLoadError as exc:
            print(f"tokenrelay worker: {exc}", file=sys.stderr)
            return EXIT_MODEL_UNAVAILABLE
        if chosen.fell_back:
            log.warning(NOT_INSTALLED)
        settings = chosen.apply(settings)
        model = partial(chosen.directory, settings)
    name = f"tokenrelay-{uuid.uuid4().hex[:12]}"
    # Bounded pools: the job threads (up to `worker_concurrency`) share them, so a worker's
    # connections stay within twice `TOKENRELAY_WORKER_REDIS_POOL_SIZE` whatever it runs
    # (plus `worker_concurrency` with `TOKENRELAY_REDIS_MIN_REPLICAS`, below).
    # One connector: RQ's dequeue and the scripts that start the job reach the same primary.
    pool_size = settings.worker_redis_pool_size
    connection = connector.sync_client(
        max_connections=pool_size, pool_wait_s=_POOL_WAIT_S, **_SOCKET_TIMEOUTS
    )
    scripts_client = connector.sync_client(
        max_connections=pool_size,
        pool_wait_s=_POOL_WAIT_S,
        decode_responses=True,
        **_SOCKET_TIMEOUTS,
    )
    plane_client = redis_connect.stream_sync_client(
        settings,
        max_connections=pool_size,
        pool_wait_s=_POOL_WAIT_S,
        decode_responses=True,
        **_SOCKET_TIMEOUTS,
    )
    active = ActiveJobs()
    redis_scripts = SyncScripts(scripts_client)
    plane_scripts = redis_scripts if plane_client is None else SyncScripts(plane_client)
    arrivals = threading.Event()
    batcher = Batcher(
        lambda: build_engine(settings, arrivals, model), plane_scripts, settings, active, arrivals
    )
    try:
        engine = batcher.start()
    except ModelLoadError as exc:
        print(
            f"tokenrelay worker: {exc}\n"
            "Set TOKENRELAY_MODEL to a local model directory, a GGUF file or a reachable hub "
            "id, or run `tokenrelay serve --demo` (or `tokenrelay worker --demo`) for the "
            "offline demo model.",
            file=sys.stderr,
        )
        return EXIT_MODEL_UNAVAILABLE
    tokenizer_json = engine.tokenizer_json()
    if tokenizer_json is None:
        # The API cannot hash prompts without the tokenizer (the synthetic engine): no index
        # to record, no job to be placed here.
        settings = settings.model_copy(update={"prefix_placement": "off"})
    # With MIN_REPLICAS each job thread holds a connection while a replica acknowledges its
    # START or FINISH (`FailoverGuard`): a pool of their own, so that lease renewals and
    # events never wait for one.
    guard_client = scripts_client
    if settings.redis_min_replicas:
        guard_client = connector.sync_client(
            max_connections=settings.worker_concurrency,
            pool_wait_s=_POOL_WAIT_S,
            decode_responses=True,
            **_SOCKET_TIMEOUTS,
        )
    guard = FailoverGuard(settings, guard_client, connector.primary_address)
    start_signal = StartSignal()
    runner = JobRunner(
        engine,
        batcher,
        redis_scripts,
        settings,
        name,
        active,
        guard,
        plane_scripts,
        start_signal.started,
    )
    limits = LimitsPublisher(
        settings.model_id,
        engine.max_context_tokens,
        settings.worker_max_batch_tokens,
        tokenizer_json,
        engine.chat_template(),
        settings.tool_call_parser,
        settings.prefix_placement_block_tokens,
    )
    keeper = LeaseKeeper(settings, scripts_client, connection, active, name, limits, plane_scripts)
    drain = threading.Timer(
        settings.worker_drain_s, active.request_stop_all, args=(StopReason.SHUTDOWN,)
    )
    drain.daemon = True
    stopping = threading.Event()

    def on_stop_requested() -> None:
        if not stopping.is_set():
            stopping.set()
            drain.start()
            # Off the signal handler: jobs placed here go to the model's queues at once.
            threading.Thread(target=keeper.leave, name="leave", daemon=True).start()

    following = threading.Event()
    watch = threading.Thread(
        target=connector.follow_primary, args=(following,), name="primary-watch", daemon=True
    )
    keeper.start()
    watch.start()
    log.info(
        "worker %s serving %s on %s, up to %d jobs at once, tool-call parser %s",
        name,
        settings.model_id,
        engine.device,
        settings.worker_concurrency,
        settings.tool_call_parser,
    )
    try:
        while not stopping.is_set():
            worker = build_worker(
                connection,
                name,
                {GENERATE_FUNCTION: runner.generate},
                model=settings.model_id,
                concurrency=settings.worker_concurrency,
                on_stop_requested=on_stop_requested,
                start_signal=start_signal,
            )
            try:
                worker.work(logging_level=None)  # the process's logging (`log_config`)
            except redis.RedisError as exc:
                # Connection, timeout, and a server that is no primary (READONLY) or still
                # loading its data (LOADING): all wait for Redis to be usable again.
                log.warning("lost Redis: %r", exc)
            # RQ's loop also ends by itself on a Redis timeout or an unexpected error:
            # only a stop request ends this worker.
            while not stopping.is_set():
                log.warning("RQ's work loop ended; restarting it in %.1fs", _RECONNECT_BACKOFF_S)
                time.sleep(_RECONNECT_BACKOFF_S)
                if _deregister(worker):
                    break
    except StopRequested:
        log.info("stop requested while reconnecting")
    finally:
        drain.cancel()
        following.set()
        batcher.stop()
        keeper.stop()
        keeper.leave()
        scripts_client.close()
        guard_client.close()
        connection.close()
        connector.close()
    return 0
