"""The jobs one worker process is running, shared by its runner and its lease keeper."""

from __future__ import annotations

import threading
from enum import StrEnum


class StopReason(StrEnum):
    CANCELLED = "cancelled"
    LEASE_LOST = "lease_lost"
    SHUTDOWN = "shutdown"


class ActiveJobs:
    """Thread-safe registry of running job ids and the stop requests against them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._stops: dict[str, StopReason] = {}

    def add(self, job_id: str) -> None:
        with self._lock:
            self._running.add(job_id)

    def remove(self, job_id: str) -> None:
        with self._lock:
            self._running.discard(job_id)
            self._stops.pop(job_id, None)

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
