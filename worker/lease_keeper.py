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
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from tokenrelay.shared.redis import job_scripts, keys
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
        self._register = job_scripts.register_worker(
            settings, worker_name, settings.model_id, settings.worker_concurrency
        )
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

    def _heartbeat(self) -> None:
        self._scripts.run(self._register)
        self._limits.publish(self._client)

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
