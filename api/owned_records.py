"""Records a key owns (files, batches): a Redis hash per id with an owner field, found only
by its owner. Another key's id answers the same 404 as an unknown one."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import redis.asyncio

from tokenrelay.api.deps import Caller
from tokenrelay.shared.errors import NotFound


@dataclass(frozen=True)
class OwnedRecords:
    """One kind of owned record: how its ids look, where its hash is, the 404 for a miss."""

    noun: str
    id_pattern: re.Pattern[str]
    hash_key: Callable[[str], str]
    not_found: type[NotFound]
    owner_field: str

    async def fields(
        self, redis_client: redis.asyncio.Redis, caller: Caller, record_id: str
    ) -> dict[str, str]:
        """The caller's record's hash; raises `not_found` (param `<noun>_id`) otherwise."""
        if self.id_pattern.match(record_id):
            found = cast("dict[str, str]", await redis_client.hgetall(self.hash_key(record_id)))
            if found and caller.owns(found.get(self.owner_field)):
                return found
        raise self.not_found(f"no {self.noun} {record_id!r}", param=f"{self.noun}_id")
