"""Background duties of a worker process, on two daemon threads.

- Register the worker (model, capacity, heartbeat) so `/v1/models` lists its model, and
  publish the model's limits and tokenizer for admission checks (`shared.redis.model_limits`).
- Renew the leases of the jobs it runs, all in one round trip, every third of the lease
  TTL, stop the cancelled ones among them (a cancel message this process missed between
  pub/sub connections), and run the lease reaper (ending jobs of dead workers and expired
  queued jobs). A lease found expired means another process may already have declared the
  job lost: the runner stops it at its next step. While renewals fail, a job whose lease ran
  out on this process's clock (`ActiveJobs.lease_valid`) is stopped the same way.
- Listen on the cancel channel and flag running jobs for a stop at their next step.
- Keep the worker listed for placement by prefix while it takes jobs, sweep the queues of
  its model's dead workers to the model's queues on every heartbeat, and, once told to stop,
  hand its own queues over at once and stay unlisted (`leave`; `shared.redis.placement`).
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from tokenrelay.shared.redis import job_scripts, keys, placement
from tokenrelay.shared.redis.model_limits import LimitsPublisher
from tokenrelay.shared.redis.rq_jobs import fail_lost_jobs
from tokenrelay.shared.redis.scripts import SyncScripts
from tokenrelay.shared.redis.token_plane import drain_outbox_sync
from tokenrelay.shared.settings import Settings
from tokenrelay.worker.active_jobs import ActiveJobs, StopReason

log = logging.getLogger(__name__)

_LISTEN_POLL_S = 1.0


class LeaseKeeper:
    def __init__(
        self,
        settings: Settings,
        client: redis.Redis,
        rq_connection: redis.Redis,
        active: ActiveJobs,
        worker_name: str,
        limits: LimitsPublisher,
        plane_scripts: SyncScripts | None = None,
    ) -> None:
        """`plane_scripts` run on the token plane's own Redis, where it has one: the lease
        keeper closes there the logs of jobs ended here (`shared.redis.token_plane`)."""
        self._settings = settings
        self._worker_name = worker_name
        self._client = client
        self._rq_connection = rq_connection
        self._placeable = settings.prefix_placement == "on"
        self._register_lock = threading.Lock()
        self._limits = limits
        self._scripts = SyncScripts(client)
        self._plane_scripts = plane_scripts or self._scripts
        self._active = active
        self._stopping = threading.Event()
        self._threads = [
            threading.Thread(target=self._renew_loop, name="lease-renewal", daemon=True),
            threading.Thread(target=self._cancel_loop, name="cancel-listener", daemon=True),
        ]

    def start(self) -> None:
        try:
            self._heartbeat()
        except redis.RedisError as exc:
            log.warning("worker registration failed, will retry: %s", exc)
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stopping.set()
        for thread in self._threads:
            thread.join(timeout=5)

    def leave(self) -> None:
        """Take no more jobs placed by prefix, and hand the ones queued here to the model's
        queues: when told to stop, at once (the drain only finishes running jobs), and again
        as the process exits. Never raises: a worker that could not reach Redis is swept
        once its heartbeat expires."""
        with self._register_lock:
            self._placeable = False
            try:
                self._sweep(leaving=self._worker_name)
            except redis.RedisError as exc:
                log.warning("could not hand this worker's queues over: %s", exc)

    def _sweep(self, leaving: str = "") -> None:
        call = placement.sweep(self._settings.model_id, leaving)
        moved = placement.parse_sweep(self._scripts.run(call)).moved
        if moved:
            log.info("handed %d jobs placed on stopped workers to the model's queues", moved)

    def _heartbeat(self) -> None:
        settings = self._settings
        with self._register_lock:
            register = job_scripts.register_worker(
                settings,
                self._worker_name,
                settings.model_id,
                settings.worker_concurrency,
                placeable=self._placeable,
            )
            self._scripts.run(register)
        self._limits.publish(self._client)
        self._sweep()

    def renew_once(self) -> None:
        self._heartbeat()
        job_ids = self._active.ids()
        if job_ids:
            sent_at = time.monotonic()
            reply = job_scripts.parse_renew(
                self._scripts.run(job_scripts.renew(self._settings, job_ids, self._worker_name))
            )
            renewed = [job_id for job_id in job_ids if job_id not in reply.lost]
            self._active.lease_renewed(renewed, sent_at, self._settings.lease_ttl_s)
            for job_id in reply.lost:
                if not self._active.is_ending(job_id):  # else its own end took the lease
                    log.warning("lease of job %s expired before renewal; stopping it", job_id)
                self._active.request_stop(job_id, StopReason.LEASE_LOST)
            for job_id in reply.cancelled:
                self._active.request_stop(job_id, StopReason.CANCELLED)
        lost = self._scripts.run(job_scripts.reap(self._settings))
        if lost:
            fail_lost_jobs(self._rq_connection, lost, self._settings.result_ttl_s)
        drain_outbox_sync(self._client, self._plane_scripts, self._settings)

    def _renew_loop(self) -> None:
        interval_s = self._settings.lease_ttl_s / 3
        while not self._stopping.wait(interval_s):
            try:
                self.renew_once()
            except redis.RedisError as exc:
                log.warning("lease renewal failed, will retry: %s", exc)
                for job_id in self._active.expired_leases():
                    self._active.request_stop(job_id, StopReason.LEASE_LOST)

    def _cancel_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self._listen_for_cancels()
            except redis.RedisError as exc:
                log.warning("cancel listener lost Redis, reconnecting: %s", exc)
                self._stopping.wait(_LISTEN_POLL_S)

    def _listen_for_cancels(self) -> None:
        pubsub = self._client.pubsub(ignore_subscribe_messages=True)
        try:
            pubsub.subscribe(keys.cancel_channel())
            while not self._stopping.is_set():
                message = pubsub.get_message(timeout=_LISTEN_POLL_S)
                if message is not None:
                    self._active.request_stop(str(message["data"]), StopReason.CANCELLED)
        finally:
            pubsub.close()
