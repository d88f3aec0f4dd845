"""`tokenrelay serve`: Redis (embedded unless `TOKENRELAY_REDIS_URL` is set), one worker and
one API on this machine, started together and stopped in order.

Every child leads a process group of its own, so a terminal's Ctrl-C (SIGINT to the
foreground process group) reaches `serve` alone. On SIGINT, SIGTERM or SIGHUP it stops them
one after the other, each given the time its own drain needs:

1. the API (SIGTERM): uvicorn stops accepting connections at once, and lets the responses in
   progress, streams included, end within its graceful shutdown (`TOKENRELAY_API_DRAIN_S`);
2. the worker, which went on serving those streams' jobs meanwhile (SIGTERM: it takes no new
   job and finishes its running ones within `TOKENRELAY_WORKER_DRAIN_S`);
3. the embedded Redis, last, so nothing above loses it while it stops (SIGTERM: a server
   with persistence on saves first).

A second signal stops what is left at once (SIGKILL). A child that ends by itself stops the
rest the same way, and `serve` exits with its status.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import time
from collections.abc import Iterator, Mapping, Sequence
from types import FrameType

import redis
from rq import Worker

from tokenrelay.cli.embedded_redis import EmbeddedRedis
from tokenrelay.cli.harness import POLL_INTERVAL_S, STOP_TIMEOUT_S, Child, ProcessGroup, answers
from tokenrelay.cli.harness import tokenrelay_command as command_of
from tokenrelay.shared import log_config
from tokenrelay.shared.redis.connect import RedisConnector
from tokenrelay.shared.settings import Settings

log = logging.getLogger("tokenrelay.serve")

REDIS_URL_ENV = "TOKENRELAY_REDIS_URL"
_STOP_MARGIN_S = 10.0
_READY_POLL_S = 0.5
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
EXIT_FORCED = 130


class StopRequests:
    """Counts the stop signals received, from the moment it is installed."""

    def __init__(self) -> None:
        self.count = 0
        self.first_at = 0.0

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        self.count += 1
        if self.count == 1:
            self.first_at = time.monotonic()
            log.info("stopping (%s): draining; a second Ctrl-C stops at once", _name(signum))

    @contextlib.contextmanager
    def installed(self) -> Iterator[StopRequests]:
        previous = {signum: signal.signal(signum, self) for signum in _STOP_SIGNALS}
        try:
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def serve(env: Mapping[str, str], *, host: str, port: int, worker_args: Sequence[str]) -> int:
    """Run Redis (unless `env` names one), a worker (`tokenrelay worker *worker_args`) and the
    API on `host:port` until a stop signal; returns the exit status."""
    env = dict(env)
    settings = Settings()
    log_config.configure(settings.log_level, settings.log_format)
    with StopRequests().installed() as stop, contextlib.ExitStack() as stack:
        if REDIS_URL_ENV not in env:
            embedded = stack.enter_context(EmbeddedRedis(own_process_group=True))
            stack.callback(lambda: embedded.stop(graceful=stop.count < 2))
            env[REDIS_URL_ENV] = embedded.url
            log.info("embedded Redis at %s", embedded.url)
        group = ProcessGroup(env=env, own_process_groups=True)
        in_order: list[tuple[Child, float]] = []
        stack.callback(_stop_in_order, stop, in_order)
        worker = group.spawn("worker", command_of("worker", *worker_args))
        in_order.append((worker, settings.worker_drain_s))
        api = group.spawn("api", command_of("api", "--host", host, "--port", str(port)))
        in_order.insert(0, (api, settings.api_drain_s))
        readiness = _Readiness(
            worker, settings.model_copy(update={"redis_url": env[REDIS_URL_ENV]}), host, port
        )
        stack.callback(readiness.close)
        ended = _run(stop, [api, worker], readiness)
    if ended is not None:
        code = ended.process.returncode
        log.error("the %s exited with %s; stopped the rest", ended.name, code)
        return code or 1
    log.info("stopped in %.1f s", time.monotonic() - stop.first_at)
    return EXIT_FORCED if stop.count > 1 else 0


def _run(stop: StopRequests, children: list[Child], readiness: _Readiness) -> Child | None:
    """Wait for a stop signal (None) or a child's end (that child); say once when ready."""
    while not stop.count:
        for child in children:
            if not child.running():
                return child
        readiness.poll()
        time.sleep(POLL_INTERVAL_S)
    return None


def _stop_in_order(stop: StopRequests, children: list[tuple[Child, float]]) -> None:
    """SIGTERM each child in turn and wait for it (its drain plus a margin); SIGKILL once a
    second stop signal came, or when it outlives its wait."""
    for child, drain_s in children:
        child.signal(signal.SIGTERM)
        deadline = time.monotonic() + drain_s + _STOP_MARGIN_S
        while child.running() and time.monotonic() < deadline and stop.count < 2:
            time.sleep(POLL_INTERVAL_S)
        if child.running():
            log.warning("the %s did not stop in time: killed", child.name)
            child.kill()
        child.wait(STOP_TIMEOUT_S)


class _Readiness:
    """Logs the ready line once the API answers `/readyz` and the worker has registered
    with RQ (its model is loaded)."""

    def __init__(self, worker: Child, settings: Settings, host: str, port: int) -> None:
        self._worker = worker
        self._settings = settings
        shown = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        self._base = f"http://{shown}:{port}"
        self._connector = RedisConnector(settings)
        self._redis: redis.Redis | None = None
        self._next_poll = 0.0
        self.ready = False

    def poll(self) -> None:
        if self.ready or time.monotonic() < self._next_poll:
            return
        self._next_poll = time.monotonic() + _READY_POLL_S
        if answers(f"{self._base}/readyz") and self._worker_registered():
            self.ready = True
            log.info("ready: %s", self.urls())

    def urls(self) -> str:
        parts = [f"API {self._base}/v1"]
        if self._settings.console_enabled:
            parts.append(f"console {self._base}/ui")
        if self._settings.docs_enabled:
            parts.append(f"docs {self._base}/docs")
        return ", ".join(parts) + " (Ctrl-C stops)"

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
        self._connector.close()

    def _worker_registered(self) -> bool:
        try:
            if self._redis is None:
                self._redis = self._connector.sync_client()
            workers = Worker.all(connection=self._redis)
        except redis.RedisError:
            return False
        return any(worker.pid == self._worker.pid for worker in workers)


def _name(signum: int) -> str:
    return signal.Signals(signum).name
