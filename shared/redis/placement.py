"""Placement by prefix, the Redis side: the prefix index, the workers' own queues and their
hand-off (docs/operations/prefix-placement.md).

```
 worker START ──HSET block → worker──▶ prefix index (one hash per epoch of the TTL)
 API admission ──PREFIX_LOOKUP──────▶ deepest block held, and by whom
               ──ADMIT (worker's queue while listed live, else the model's)
 worker ◀── BLPOP its queue, then the model's, per priority (high, normal, low)
 worker stop / heartbeat expired ──SWEEP_WORKER_QUEUES──▶ its queues to the model's
```

The index is approximate, on purpose: it says where a prompt's blocks *started*, not what a
worker's cache still holds (an LRU that evicts by bytes, which only the worker sees).
Recording evictions would cost a write per evicted block on the worker's hot path; a wrong
guess costs only a cache miss, never a wrong answer. It is written by the START of the
worker that took the job, from the ids it is about to prefill (so the API matches exactly
the hashes a worker computed, and a job placed on the shared queue is indexed as well as
a placed one), and read at admission by one script over the two live epochs. Its fields are
the first 8 bytes of each block's hash (`shared.prefix_blocks`), enough for a routing hint.
Its blocks are coarser than the cache's (`TOKENRELAY_PREFIX_PLACEMENT_BLOCK_TOKENS`, 64 by
default, against the cache's 16): the index picks a worker, the worker's cache then reuses
at its own granularity, and a quarter of the fields makes a 1,000-token prompt's lookup and
record cost about a quarter as much Redis CPU (docs/operations/prefix-placement.md).

Invariant: a worker's queues hold jobs only while it is listed in the model's placement
workers with a heartbeat that has not expired. ADMIT checks the listing in the script that
pushes, and SWEEP_WORKER_QUEUES unlists a worker and moves its queues in one script; a
worker told to stop sweeps itself and is not listed again (`LeaseKeeper.leave`), and any
process sweeps the dead (API nodes as they refresh their view, workers on their heartbeat).
A job's RQ `origin` is always its model's queue, so the hand-off, RQ's registries, a
continuation and `rq_jobs.give_back` all find it there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rq.job import Job
from rq.queue import Queue

from tokenrelay.shared.prefix_blocks import block_hashes
from tokenrelay.shared.redis import keys
from tokenrelay.shared.redis.rq_jobs import PRIORITIES
from tokenrelay.shared.redis.scripts import Arg, ScriptCall, timed
from tokenrelay.shared.settings import Settings

MAX_INDEXED_BLOCKS = 1024
"""The most blocks of a prompt indexed and looked up, from its start (65,536 tokens at the
default block size): bounds the script's arguments."""
INDEX_FIELD_BYTES = 8
SWEEP_BATCH = 100
"""The most dead workers one sweep hands over."""

PREFIX_LOOKUP = timed("prefix_lookup.lua")
SWEEP_WORKER_QUEUES = timed("sweep_worker_queues.lua")


def prompt_blocks(model: str, token_ids: Sequence[int], block_tokens: int) -> list[bytes]:
    """The routing hashes of a prompt's whole blocks (at most `MAX_INDEXED_BLOCKS`): the
    API and the worker both call this, on the ids the worker prefills, with the model's name
    as the namespace (a model's workers share one index)."""
    head = list(token_ids[: MAX_INDEXED_BLOCKS * block_tokens])
    return block_hashes(model, head, block_tokens)


def index_fields(hashes: Sequence[bytes]) -> list[str]:
    """The prefix index's fields of a prompt's block hashes, first block first."""
    return [digest[:INDEX_FIELD_BYTES].hex() for digest in hashes[:MAX_INDEXED_BLOCKS]]


def _index_template(model: str) -> str:
    return keys.prefix_index(model, keys.ID_PLACEHOLDER)


def _epoch_ms(settings: Settings) -> int:
    return settings.prefix_placement_ttl_s * 1000


def index_args(settings: Settings, model: str, hashes: Sequence[bytes]) -> list[Arg]:
    """START's arguments that record a job's blocks under its worker (start.lua); none for a
    prompt without a whole block or with placement off."""
    if settings.prefix_placement == "off" or not hashes:
        return []
    ttl_s = 2 * settings.prefix_placement_ttl_s
    return [_index_template(model), _epoch_ms(settings), ttl_s, *index_fields(hashes)]


def lookup(settings: Settings, model: str, hashes: Sequence[bytes]) -> ScriptCall:
    """Which worker started a job with the deepest of these blocks, lately."""
    args: list[Arg] = [_index_template(model), _epoch_ms(settings), *index_fields(hashes)]
    return ScriptCall(PREFIX_LOOKUP, [], args)


@dataclass(frozen=True)
class Holder:
    """The worker that started a job with a prompt's first `blocks` blocks."""

    worker: str
    blocks: int


def parse_lookup(reply: list[Any]) -> Holder | None:
    if not reply:
        return None
    blocks, worker = reply
    return Holder(str(worker), int(blocks))


def worker_queue_keys(worker: str) -> list[str]:
    """RQ's keys of a worker's queues, high priority first."""
    prefix = Queue.redis_queue_namespace_prefix
    return [prefix + keys.worker_queue(worker, priority) for priority in PRIORITIES]


def sweep(model: str, leaving: str = "") -> ScriptCall:
    """Hand the queues of `model`'s dead workers, and of `leaving`, to the model's queues."""
    templates = worker_queue_keys(keys.ID_PLACEHOLDER)
    args: list[Arg] = [
        leaving,
        SWEEP_BATCH,
        Job.redis_job_namespace_prefix,
        Queue.redis_queue_namespace_prefix,
        "origin",
        *templates,
    ]
    return ScriptCall(SWEEP_WORKER_QUEUES, [keys.placement_workers(model)], args)


@dataclass(frozen=True)
class Sweep:
    """What a sweep did and saw: jobs handed to the model's queues, and each live worker's
    backlog (jobs waiting in its own queues)."""

    moved: int
    backlogs: dict[str, int]


def parse_sweep(reply: list[Any]) -> Sweep:
    moved, *pairs = reply
    names, counts = pairs[0::2], pairs[1::2]
    return Sweep(int(moved), {str(n): int(c) for n, c in zip(names, counts, strict=True)})
