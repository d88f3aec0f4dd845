"""Files in Redis: a hash describing each, its content as a list of chunks, both on the
retention TTL; an owner's files in a sorted set by creation time.

Content is written chunk by chunk as it arrives (`FileWriter`) and read back the same way
(`iter_content`), so no whole file is ever held in memory. A file becomes visible (its hash
and its owner's index entry) only once all its chunks are stored.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator
from typing import Literal, cast

import redis.asyncio
from pydantic import BaseModel
from redis.typing import EncodableT, FieldT

from tokenrelay.api.deps import Caller
from tokenrelay.api.owned_records import OwnedRecords
from tokenrelay.api.state import AppState
from tokenrelay.shared.errors import FileNotFound
from tokenrelay.shared.redis import keys

CHUNK_BYTES = 256 * 1024
UPLOAD_TTL_S = 3600  # chunks of an upload that never completes are dropped after this
FILE_ID_PATTERN = re.compile(r"^file-[0-9a-f]{32}$")

FilePurpose = Literal["batch", "batch_output"]


class FileObject(BaseModel):
    """OpenAI's file object."""

    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int
    expires_at: int | None
    filename: str
    purpose: FilePurpose
    status: Literal["processed"] = "processed"
    status_details: str | None = None


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"] = "file"
    deleted: bool


class FileList(BaseModel):
    object: Literal["list"] = "list"
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


_OWNER = "owner"
_LINES = "lines"
FILES = OwnedRecords("file", FILE_ID_PATTERN, keys.file, FileNotFound, _OWNER)


class FileWriter:
    """Appends one file's content chunk by chunk, then `commit`s it (or `discard`s it)."""

    def __init__(self, state: AppState) -> None:
        self.file_id = f"file-{uuid.uuid4().hex}"
        self.size = 0
        self.lines = 0
        self._redis = state.redis
        self._bytes = state.redis_bytes
        self._pending = bytearray()
        self._ends_with_newline = True

    async def write(self, data: bytes) -> None:
        """Add `data`; a full chunk goes to Redis at once."""
        if not data:
            return
        self.size += len(data)
        self.lines += data.count(b"\n")
        self._ends_with_newline = data.endswith(b"\n")
        self._pending += data
        while len(self._pending) >= CHUNK_BYTES:
            await self._push(bytes(self._pending[:CHUNK_BYTES]))
            del self._pending[:CHUNK_BYTES]

    @property
    def line_count(self) -> int:
        """Lines so far, a last one without its newline included."""
        return self.lines + (0 if self._ends_with_newline else 1)

    async def _push(self, chunk: bytes) -> None:
        chunks = keys.file_chunks(self.file_id)
        async with self._bytes.pipeline(transaction=False) as pipe:
            pipe.rpush(chunks, chunk)
            pipe.expire(chunks, UPLOAD_TTL_S)
            await pipe.execute()

    async def commit(
        self, owner: str, filename: str, purpose: FilePurpose, retention_s: int
    ) -> FileObject:
        """Store what is left, then make the file visible to its owner."""
        if self._pending:
            await self._push(bytes(self._pending))
            self._pending.clear()
        now = int(time.time())
        item = FileObject(
            id=self.file_id,
            bytes=self.size,
            created_at=now,
            expires_at=now + retention_s,
            filename=filename,
            purpose=purpose,
        )
        fields: dict[FieldT, EncodableT] = {_OWNER: owner, _LINES: str(self.line_count)}
        fields.update(_fields(item))
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(keys.file(self.file_id), mapping=fields)
            pipe.expire(keys.file(self.file_id), retention_s)
            pipe.expire(keys.file_chunks(self.file_id), retention_s)
            pipe.zadd(keys.owner_files(owner), {self.file_id: time.time() * 1000})
            await pipe.execute()
        return item

    async def discard(self) -> None:
        await self._redis.delete(keys.file_chunks(self.file_id))


def _fields(item: FileObject) -> dict[str, str]:
    return {
        name: str(value)
        for name, value in item.model_dump(include={"bytes", "created_at", "expires_at"}).items()
    } | {"filename": item.filename, "purpose": item.purpose}


def _from_fields(file_id: str, fields: dict[str, str]) -> FileObject:
    return FileObject(
        id=file_id,
        bytes=int(fields["bytes"]),
        created_at=int(fields["created_at"]),
        expires_at=int(fields["expires_at"]),
        filename=fields["filename"],
        purpose=fields["purpose"],  # type: ignore[arg-type]
    )


async def get_file(redis_client: redis.asyncio.Redis, caller: Caller, file_id: str) -> FileObject:
    """The caller's file; 404 for an unknown id and another key's file alike."""
    fields = await FILES.fields(redis_client, caller, file_id)
    return _from_fields(file_id, fields)


async def line_count(redis_client: redis.asyncio.Redis, caller: Caller, file_id: str) -> int:
    """How many lines the caller's file holds (counted at upload)."""
    fields = await FILES.fields(redis_client, caller, file_id)
    return int(fields.get(_LINES, "0"))


async def list_files(
    redis_client: redis.asyncio.Redis,
    caller: Caller,
    *,
    after: str | None,
    limit: int,
    order: Literal["asc", "desc"],
    purpose: str | None,
) -> FileList:
    """One page of the caller's files, newest first by default; expired ones are dropped
    from the index as they are met."""
    index = keys.owner_files(caller.owner)
    ids = cast(
        "list[str]",
        await redis_client.zrange(index, 0, -1)
        if order == "asc"
        else await redis_client.zrevrange(index, 0, -1),
    )
    if after is not None:
        ids = ids[ids.index(after) + 1 :] if after in ids else []
    found: list[FileObject] = []
    has_more = False
    for file_id in ids:
        fields = cast("dict[str, str]", await redis_client.hgetall(keys.file(file_id)))
        if not fields:
            await redis_client.zrem(index, file_id)
            continue
        item = _from_fields(file_id, fields)
        if purpose is not None and item.purpose != purpose:
            continue
        if len(found) == limit:
            has_more = True
            break
        found.append(item)
    return FileList(
        data=found,
        first_id=found[0].id if found else None,
        last_id=found[-1].id if found else None,
        has_more=has_more,
    )


async def delete_file(
    redis_client: redis.asyncio.Redis, caller: Caller, file_id: str
) -> FileDeleted:
    fields = await FILES.fields(redis_client, caller, file_id)
    await remove_file(redis_client, fields[_OWNER], file_id)
    return FileDeleted(id=file_id, deleted=True)


async def remove_file(redis_client: redis.asyncio.Redis, owner: str, file_id: str) -> None:
    """Delete `owner`'s file `file_id`: its record, its content and its place in the list."""
    async with redis_client.pipeline(transaction=True) as pipe:
        pipe.delete(keys.file(file_id), keys.file_chunks(file_id))
        pipe.zrem(keys.owner_files(owner), file_id)
        await pipe.execute()


async def iter_content(state: AppState, file_id: str) -> AsyncIterator[bytes]:
    """The file's content, one stored chunk at a time."""
    chunks = keys.file_chunks(file_id)
    index = 0
    while True:
        found = cast("list[bytes]", await state.redis_bytes.lrange(chunks, index, index))
        if not found:
            return
        yield found[0]
        index += 1
