"""The jobs one worker process is running, shared by its runner and its lease keeper."""

from __future__ import annotations

import threading
import time
from enum import StrEnum


class StopReason(StrEnum):
    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"


class ActiveJobs:
    """Thread-safe registry of running job ids, the stop requests against them, and how long
    each one's lease surely holds (on this process's monotonic clock)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._stops: dict[str, StopReason] = {}
        self._lease_until: dict[str, float] = {}
        self._ending: set[str] = set()

    def add(self, job_id: str) -> bool:
        """Register a job; False if this process runs it already (it was dequeued twice)."""
        with self._lock:
            if job_id in self._running:
                return False
            self._running.add(job_id)
            return True

    def remove(self, job_id: str) -> None:
        with self._lock:
            self._running.discard(job_id)
            self._stops.pop(job_id, None)
            self._lease_until.pop(job_id, None)
            self._ending.discard(job_id)

    def ending(self, job_id: str) -> None:
        """The runner is ending the job (FINISH): its lease may be gone because it ended."""
        with self._lock:
            if job_id in self._running:
                self._ending.add(job_id)

    def is_ending(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._ending

    def lease_renewed(self, job_ids: list[str], sent_at: float, ttl_s: float) -> None:
        """Redis extended these leases by `ttl_s` at some moment after `sent_at` (monotonic)."""
        with self._lock:
            for job_id in job_ids:
                if job_id in self._running:
                    self._lease_until[job_id] = sent_at + ttl_s

    def expired_leases(self) -> list[str]:
        """Jobs whose lease, once taken, may have run out by now."""
        now = time.monotonic()
        with self._lock:
            return [job_id for job_id, until in self._lease_until.items() if now >= until]

    def lease_valid(self, job_id: str) -> bool:
        """Whether the job's lease surely still holds (never renewed: not known to)."""
        with self._lock:
            return time.monotonic() < self._lease_until.get(job_id, float("-inf"))

    def ids(self) -> list[str]:
        with self._lock:
            return list(self._running)

    def request_stop(self, job_id: str, reason: StopReason) -> None:
        """Ask the runner to stop `job_id` at its next decoding step (if it runs here)."""
        with self._lock:
            if job_id in self._running:
                self._stops.setdefault(job_id, reason)

    def request_stop_all(self, reason: StopReason) -> None:
        with self._lock:
            for job_id in self._running:
                self._stops.setdefault(job_id, reason)

    def stop_reason(self, job_id: str) -> StopReason | None:
        with self._lock:
            return self._stops.get(job_id)
