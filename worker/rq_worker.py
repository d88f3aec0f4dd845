"""tokenrelay's RQ worker: runs jobs in this process (the model stays loaded; never forks)
and only runs allow-listed job functions, whatever a job hash in Redis names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import redis
from rq.job import Job
from rq.serializers import JSONSerializer
from rq.worker import SimpleWorker

from shared.rq_jobs import generation_queue


class UnknownJobFunction(Exception):
    """A job named a function outside the worker's allow-list."""


def allow_listed_job_class(functions: Mapping[str, Callable[..., Any]]) -> type[Job]:
    """A `Job` class whose `func` resolves only the names in `functions`, never by import."""

    class AllowListedJob(Job):
        @property
        def func(self) -> Callable[..., Any]:
            name = self.func_name
            if name is None or name not in functions:
                raise UnknownJobFunction(f"job function {name!r} is not allowed on this worker")
            return functions[name]

    return AllowListedJob


class DrainingWorker(SimpleWorker):
    """On SIGTERM/SIGINT RQ stops dequeuing and lets the running job finish (warm shutdown);
    this also calls `on_stop_requested`, which bounds that wait (the drain period)."""

    def __init__(self, *args: Any, on_stop_requested: Callable[[], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_stop_requested = on_stop_requested

    def request_stop(self, signum: Any, frame: Any) -> None:
        self._on_stop_requested()
        super().request_stop(signum, frame)


def build_worker(
    connection: redis.Redis,
    name: str,
    functions: Mapping[str, Callable[..., Any]],
    on_stop_requested: Callable[[], None] = lambda: None,
) -> SimpleWorker:
    return DrainingWorker(
        [generation_queue(connection)],
        name=name,
        connection=connection,
        serializer=JSONSerializer,
        job_class=allow_listed_job_class(functions),
        on_stop_requested=on_stop_requested,
    )
