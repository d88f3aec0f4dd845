"""The RQ side of the contract: queue, job function name, serializer, enqueue options.

Jobs travel as JSON, never as serialized Python objects. The job function name is a tag,
not an import path: workers only run the functions in their allow-list (`worker.rq_worker`).
"""

from __future__ import annotations

import re
from typing import Any, Literal

import redis
from rq import Queue
from rq.exceptions import NoSuchJobError
from rq.job import Job
from rq.job import JobStatus as RQJobStatus
from rq.registry import FailedJobRegistry, StartedJobRegistry
from rq.serializers import JSONSerializer
from rq.utils import now

from tokenrelay.shared.generation import GenerationRequest
from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.job_scripts import Enqueue
from tokenrelay.shared.redis.replies import as_text
from tokenrelay.shared.settings import Settings

GENERATE_FUNCTION = "tokenrelay.generate"
READER_KEY = "tokenrelay_reader"
"""The key of a generation job's request payload naming the API process that reads it."""
Priority = Literal["high", "normal", "low"]
PRIORITIES: tuple[Priority, ...] = ("high", "normal", "low")
JOB_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
WORKER_LOST_REASON = "worker_lost: the worker running this job stopped renewing its lease"


def generation_queue(connection: redis.Redis, model: str, priority: Priority) -> Queue:
    name = keys.generation_queue(model, priority)
    return Queue(name, connection=connection, serializer=JSONSerializer)


def worker_queues(connection: redis.Redis, model: str, worker: str) -> list[Queue]:
    """A worker's queues, in the order it drains them: high, normal, low priority, and in
    each its own queue (jobs placed on it by prefix: `shared.redis.placement`) before its
    model's."""
    return [
        queue
        for priority in PRIORITIES
        for queue in (
            Queue(
                keys.worker_queue(worker, priority),
                connection=connection,
                serializer=JSONSerializer,
            ),
            generation_queue(connection, model, priority),
        )
    ]


_MODEL_MARK = "\0"
_QUEUE_NAME_PARTS = tuple(
    keys.generation_queue(_MODEL_MARK, priority).split(_MODEL_MARK) for priority in PRIORITIES
)


def queue_model(name: str) -> str | None:
    """The model of the generation queue called `name`, or `None` if `name` is not one of
    tokenrelay's queues (another application's RQ queue in the same Redis)."""
    for head, tail in _QUEUE_NAME_PARTS:
        if len(name) > len(head) + len(tail) and name.startswith(head) and name.endswith(tail):
            return name[len(head) : len(name) - len(tail)]
    return None


def queued_job(
    connection: redis.Redis,
    settings: Settings,
    job_id: str,
    request: GenerationRequest,
    priority: Priority = "normal",
    reader: str | None = None,
    worker: str = "",
) -> Enqueue:
    """An admitted job's entry on its model's queue of its priority, as RQ's `enqueue_call`
    would save it (`connection` is never used: RQ's job needs one); ADMIT writes it in the
    script that admits the job (`scripts.admit`). RQ drops the job if it waits longer than
    the allowed queue wait. Its RQ description names the job, not its arguments: RQ's
    default (the call string, prompt included) is kept in Redis and shown by `rq info`.
    `reader`, the API process that reads the job's events, tells its worker where to publish
    them (`scripts.emit`): it rides in the request's payload (`READER_KEY`), which a worker
    from before reader channels ignores (`GenerationRequest` ignores unknown fields), so it
    runs the job as before instead of failing it over an unexpected argument. A `worker`
    chosen by prefix (`api.jobs.placement`) gets it in its own queue of that priority, while
    it is live; its RQ origin stays the model's queue (`shared.redis.placement`)."""
    queue = generation_queue(connection, request.model, priority)
    payload: dict[str, Any] = request.model_dump(mode="json")
    if reader is not None:
        payload[READER_KEY] = reader
    job = queue.create_job(
        GENERATE_FUNCTION,
        kwargs={"job_id": job_id, "request": payload},
        job_id=job_id,
        description=job_description(job_id),
        timeout=settings.job_timeout_s,
        ttl=max(1, int(settings.max_queue_wait_s) + 1),
        result_ttl=settings.result_ttl_s,
        failure_ttl=settings.result_ttl_s,
    )
    job.enqueued_at = now()
    assert job.ttl is not None
    fields = tuple(part for pair in job.to_dict().items() for part in pair)
    if not worker:
        return Enqueue(Queue.redis_queues_keys, queue.key, job.key, fields, job.ttl)
    worker_queue = Queue.redis_queue_namespace_prefix + keys.worker_queue(worker, priority)
    placement_workers = keys.placement_workers(request.model)
    return Enqueue(
        Queue.redis_queues_keys,
        queue.key,
        job.key,
        fields,
        job.ttl,
        worker,
        worker_queue,
        placement_workers,
    )


def job_description(job_id: str) -> str:
    """The RQ description of a generation job: never its prompt."""
    return f"{GENERATE_FUNCTION}({job_id})"


def _origin_queue(connection: redis.Redis, job: Job) -> Queue:
    return Queue(job.origin, connection=connection, serializer=JSONSerializer)


def remove_queued(connection: redis.Redis, job_id: str) -> None:
    """Take a cancelled job out of its RQ queue (a worker would skip it anyway)."""
    try:
        job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
    except NoSuchJobError:
        return
    _origin_queue(connection, job).remove(job_id)


def give_back(client: redis.Redis, job_id: str) -> bool:
    """Put a job at the front of its queue unless the queue lists it; True if it did.

    For a job that its worker ran and then found still queued in tokenrelay's record: a
    failover's new primary received the worker's dequeue but not the job's start (the
    promotion fell between them), and would let the job expire in no queue. A job listed
    twice is harmless: START refuses a job another worker runs, and a worker one it runs."""
    origin = as_text(client.hget(Job.key_for(job_id), "origin"))
    if origin is None:
        return False
    queue_key = Queue.redis_queue_namespace_prefix + origin
    if client.lpos(queue_key, job_id) is not None:
        return False
    client.lpush(queue_key, job_id)
    return True


def fail_lost_jobs(connection: redis.Redis, job_ids: list[str], result_ttl_s: int) -> None:
    """Move jobs whose worker was declared lost from RQ's started to its failed registry,
    now rather than at RQ's next maintenance (every 10 minutes by default)."""
    for job_id in job_ids:
        try:
            job = Job.fetch(job_id, connection=connection, serializer=JSONSerializer)
        except NoSuchJobError:
            continue
        if job.get_status(refresh=False) != RQJobStatus.STARTED:
            continue
        queue = _origin_queue(connection, job)
        started = StartedJobRegistry(queue=queue)
        failed = FailedJobRegistry(queue=queue)
        with connection.pipeline() as pipe:
            started.remove_executions(job, pipeline=pipe)
            job.set_status(RQJobStatus.FAILED, pipeline=pipe)
            failed.add(job, ttl=result_ttl_s, exc_string=WORKER_LOST_REASON, pipeline=pipe)
            pipe.execute()
