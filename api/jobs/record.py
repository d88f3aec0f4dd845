"""Read a job's record: its hash and its text.

A worker's FINISH stores the whole text when it ends the job; EMIT writes none per event.
So the text of a job still running, or one ended by another process (the lease reaper, a
cancel before start), is the texts of its event log's token chunks, joined.
"""

from __future__ import annotations

from typing import Any

import redis.asyncio
from redis.asyncio.cluster import RedisCluster

from tokenrelay.api.webhooks.dispatcher import PayloadGone
from tokenrelay.shared.events import TokenChunk, parse_event
from tokenrelay.shared.jobs import JobField, JobRecord
from tokenrelay.shared.redis import keys


async def read_job(
    client: redis.asyncio.Redis, plane: redis.asyncio.Redis | RedisCluster, job_id: str
) -> tuple[dict[str, str], str]:
    """The job's hash (empty when unknown), from the control Redis `client`, and its text so
    far, or final, from the token plane's `plane` (the same client when one Redis holds both)."""
    if plane is client:
        async with client.pipeline(transaction=False) as pipe:
            pipe.hgetall(keys.job(job_id))
            pipe.get(keys.job_text(job_id))
            fields, text = await pipe.execute()
    else:
        fields = await client.hgetall(keys.job(job_id))
        text = await plane.get(keys.job_text(job_id))
    if text is None and fields:
        entries: Any = await plane.xrange(keys.job_events(job_id))
        chunks = (parse_event(entry["e"]) for _, entry in entries)
        text = "".join(chunk.text for chunk in chunks if isinstance(chunk, TokenChunk))
    return fields, text or ""


async def job_webhook(
    client: redis.asyncio.Redis, plane: redis.asyncio.Redis | RedisCluster, job_id: str
) -> tuple[str, str]:
    """A job's webhook URL and body (its record), for the webhook dispatcher."""
    fields, text = await read_job(client, plane, job_id)
    url = fields.get(JobField.WEBHOOK) if fields else None
    if not url or JobField.STATUS not in fields:
        raise PayloadGone("the job's record has expired or has no webhook")
    try:
        return url, JobRecord.from_redis(job_id, fields, text).model_dump_json()
    except (KeyError, ValueError) as exc:
        raise PayloadGone(f"the job's record is incomplete: {exc!r}") from None
