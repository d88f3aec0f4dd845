"""The Redis key schema: every key and channel tokenrelay uses is built here, nowhere else.

Lua scripts receive key names in KEYS, or (the job library, which ends jobs it finds in the
lease set) as templates built by these same functions (`JOB_KEY_TEMPLATES`), so not even a
script spells a key by hand.

The token plane (a job's event log, channel and text) may live on its own Redis, a Redis
Cluster among them (`TOKENRELAY_STREAM_REDIS_URL`): its keys carry the job id as a hash tag,
`{<id>}`, so a job's three keys share one cluster slot and one script can touch them all.
"""

from __future__ import annotations

PREFIX = "tokenrelay"
ID_PLACEHOLDER = "{id}"


def leases() -> str:
    """Sorted set of admitted, unfinished jobs: member job id, score lease expiry (ms)."""
    return f"{PREFIX}:leases"


def job(job_id: str) -> str:
    """Hash with a job's status, owner, timestamps, usage and error."""
    return f"{PREFIX}:job:{job_id}"


def job_events(job_id: str) -> str:
    """Stream holding a job's replay log: every event, in `seq` order (token plane)."""
    return f"{PREFIX}:job:{{{job_id}}}:events"


def job_channel(job_id: str) -> str:
    """Pub/sub channel on which a job's events are published live (token plane; a shard
    channel on a Redis Cluster)."""
    return f"{PREFIX}:job:{{{job_id}}}:channel"


def reader_channel(reader: str) -> str:
    """Pub/sub channel of one API process (`reader`, its `StreamHub.reader_id`): the token
    events of the jobs it reads, many jobs' in one message (a plain Redis token plane only)."""
    return f"{PREFIX}:reader:{reader}"


def job_text(job_id: str) -> str:
    """String holding a job's whole text, written once by its worker's FINISH (the text of a
    job still running, or ended by another process, is its event log's: `api.jobs.record`);
    token plane."""
    return f"{PREFIX}:job:{{{job_id}}}:text"


def token_plane_outbox() -> str:
    """Hash of the final events of jobs ended on the control Redis (reaped, cancelled before
    start) whose event log, on a token plane of its own, is not closed yet: job id → final
    event. Drained by `shared.redis.token_plane`; empty when one Redis serves both."""
    return f"{PREFIX}:token-plane:outbox"


def owner_jobs(owner: str) -> str:
    """Set of an owner's (API key's) admitted, unfinished job ids: its per-key quota."""
    return f"{PREFIX}:owner:{owner}:jobs"


def models() -> str:
    """Sorted set of every model a worker ever served: score = its live workers' latest
    heartbeat expiry (ms); a score in the past means no live worker serves it."""
    return f"{PREFIX}:models"


def worker(name: str) -> str:
    """Hash describing one live worker (model, capacity, heartbeat); expires with it."""
    return f"{PREFIX}:worker:{name}"


def model_limits(model: str) -> str:
    """Hash of what a model's workers publish for admission (`shared.redis.model_limits`): context
    window, batch token budget, and the content hash of their tokenizer."""
    return f"{PREFIX}:model:{model}:limits"


def tokenizer(sha256: str) -> str:
    """String holding a tokenizer in `tokenizers`' JSON form, named by its SHA-256."""
    return f"{PREFIX}:tokenizer:{sha256}"


def chat_template(sha256: str) -> str:
    """String holding a model's chat template (`model_limits.ChatTemplate`'s JSON), named by
    its SHA-256."""
    return f"{PREFIX}:chat-template:{sha256}"


def cancel_channel() -> str:
    """Pub/sub channel on which the ids of running jobs to stop are announced to workers."""
    return f"{PREFIX}:cancel"


def recent_jobs() -> str:
    """List of the ids of the most recently admitted jobs, newest first (capped)."""
    return f"{PREFIX}:recent-jobs"


def replication_mark() -> str:
    """Counter the API increments after an admission's writes, to `WAIT` for its replicas."""
    return f"{PREFIX}:replication-mark"


def rejections() -> str:
    """Hash counting refused admissions: field `error_type`, value how many."""
    return f"{PREFIX}:rejections"


def migrations() -> str:
    """Counter of running jobs the lease reaper put back in their queue as continuations."""
    return f"{PREFIX}:migrations"


def generation_queue(model: str, priority: str) -> str:
    """Name of the RQ queue of one model and priority (RQ stores it as `rq:queue:<name>`).

    A worker drains its model's queues in the order high, normal, low."""
    return f"{PREFIX}:{model}:{priority}"


def worker_queue(worker: str, priority: str) -> str:
    """Name of the RQ queue of one worker and priority (`rq:queue:<name>`): jobs placed by
    prefix on that worker (`api.jobs.placement`), which it drains before its model's queue
    of the same priority. Its jobs' RQ `origin` stays the model's queue, so RQ's registries,
    a continuation and a hand-off all put them back there."""
    return f"{PREFIX}:worker:{worker}:queue-{priority}"


def placement_workers(model: str) -> str:
    """Sorted set of the workers of `model` that take jobs placed by prefix: member the
    worker name, score its heartbeat's expiry (ms). A worker leaves it when told to stop; a
    dead one is swept out, its queues handed to the model's (`shared.redis.placement`)."""
    return f"{PREFIX}:model:{model}:placement-workers"


def prefix_index(model: str, epoch: int | str) -> str:
    """Hash of the prompt blocks `model`'s workers started jobs with during one epoch of
    `TOKENRELAY_PREFIX_PLACEMENT_TTL_S`: field a block hash's first 8 bytes in hex, value the
    worker that prefilled it. Expires two epochs after its own."""
    return f"{PREFIX}:model:{model}:prefix-index:{epoch}"


def webhook_deliveries() -> str:
    """List of webhook deliveries to make, JSON `{job_id, event, attempt}`: pushed left by the
    Lua library at a job's transition, taken from the right by the dispatchers
    (`api.webhooks.dispatcher`)."""
    return f"{PREFIX}:webhooks:deliveries"


def webhook_retries() -> str:
    """Sorted set of failed webhook deliveries to retry: member the record, score when due (ms)."""
    return f"{PREFIX}:webhooks:retries"


def webhook_processing(dispatcher: str) -> str:
    """List of the deliveries one webhook dispatcher has taken and not yet settled."""
    return f"{PREFIX}:webhooks:processing:{dispatcher}"


def webhook_dispatchers() -> str:
    """Sorted set of webhook dispatchers: member the dispatcher id, score heartbeat expiry (ms)."""
    return f"{PREFIX}:webhooks:dispatchers"


JOB_KEY_TEMPLATES: tuple[str, str, str, str] = (
    job(ID_PLACEHOLDER),
    job_events(ID_PLACEHOLDER),
    job_channel(ID_PLACEHOLDER),
    job_text(ID_PLACEHOLDER),
)
READER_CHANNEL_TEMPLATE = reader_channel(ID_PLACEHOLDER)
"""A reader's channel with the placeholder for its reader id (the job library publishes a
job's events there when the job has a reader)."""


def file(file_id: str) -> str:
    """Hash describing one uploaded or generated file (`api.files.store.FileObject`)."""
    return f"{PREFIX}:file:{file_id}"


def file_chunks(file_id: str) -> str:
    """List of a file's content, in chunks of at most `api.files.store.CHUNK_BYTES` bytes."""
    return f"{PREFIX}:file:{file_id}:chunks"


def owner_files(owner: str) -> str:
    """Sorted set of an owner's file ids, score the creation time (ms): `GET /v1/files`."""
    return f"{PREFIX}:owner:{owner}:files"


def batch(batch_id: str) -> str:
    """Hash holding one batch: status, endpoint, counts, timestamps, file ids."""
    return f"{PREFIX}:batch:{batch_id}"


def batch_requests(batch_id: str) -> str:
    """Hash of a validated batch's requests: field the line index, value `{custom_id, body}`."""
    return f"{PREFIX}:batch:{batch_id}:requests"


def batch_pending(batch_id: str) -> str:
    """Hash of a batch's lines handed to a job and not yet resulted: line index → job id."""
    return f"{PREFIX}:batch:{batch_id}:pending"


def batch_results(batch_id: str) -> str:
    """Hash of a batch's results, written once per line: line index → output line JSON."""
    return f"{PREFIX}:batch:{batch_id}:results"


def batch_attempts(batch_id: str) -> str:
    """Hash counting the lost jobs of each of a batch's lines: `<line index>:lost` → count."""
    return f"{PREFIX}:batch:{batch_id}:attempts"


def owner_batches(owner: str) -> str:
    """Sorted set of an owner's batch ids, score the creation time (ms): `GET /v1/batches`."""
    return f"{PREFIX}:owner:{owner}:batches"


def active_batches() -> str:
    """Sorted set of unfinished batches: member the batch id, score the expiry (ms) of the
    feeder lease that holds it (0: unclaimed), so a dead API process's batches pass on."""
    return f"{PREFIX}:batches:active"


def batch_lines_inflight() -> str:
    """Set of the job ids of admitted, unfinished batch lines (their owner-jobs set): its
    size is what batch lines hold of `MAX_INFLIGHT`, left out of interactive admission."""
    return f"{PREFIX}:batches:inflight"


def response(response_id: str) -> str:
    """Hash holding one stored Responses API response (`api.responses.store`): its owner,
    its request (echoed fields, input items) and, once settled, its final object."""
    return f"{PREFIX}:response:{response_id}"


def unsettled_responses() -> str:
    """Sorted set of stored responses whose final object is not written yet: member the
    response id, score its creation time (ms); any API process settles them
    (`api.responses.settle`)."""
    return f"{PREFIX}:responses:unsettled"
