"""API keys and what each may do: owner id, admin flag, in-flight quota, default priority.

Keys come from `TOKENRELAY_API_KEYS` / `TOKENRELAY_ADMIN_API_KEYS` (plain keys, hashed at
start) and from `TOKENRELAY_API_KEYS_FILE`, a JSON list that holds only SHA-256 hashes
(`tokenrelay hash-key KEY` prints one):

    [{"sha256": "<hex>", "name": "team-a", "max_inflight": 4, "priority": "high",
      "admin": false}]

Only hashes are kept in memory; a caller's owner id is derived from its key's hash.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from tokenrelay.shared.rq_jobs import Priority
from tokenrelay.shared.settings import Settings


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


@dataclass(frozen=True)
class KeyPolicy:
    owner: str
    is_admin: bool = False
    max_inflight: int | None = None
    priority: Priority = "normal"


class KeyFileEntry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    name: str = ""
    max_inflight: int | None = Field(default=None, ge=1)
    priority: Priority = "normal"
    admin: bool = False


class KeyFileError(ValueError):
    """The keys file is missing or malformed."""


class KeyRing:
    def __init__(self, policies: dict[str, KeyPolicy]) -> None:
        self._by_hash = policies

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        policies = {hash_key(key): KeyPolicy(owner=hash_key(key)[:24]) for key in settings.api_keys}
        for key in settings.admin_api_keys:
            policies[hash_key(key)] = KeyPolicy(owner=hash_key(key)[:24], is_admin=True)
        if settings.api_keys_file:
            for entry in load_key_file(Path(settings.api_keys_file)):
                policies[entry.sha256] = KeyPolicy(
                    owner=entry.sha256[:24],
                    is_admin=entry.admin,
                    max_inflight=entry.max_inflight,
                    priority=entry.priority,
                )
        return cls(policies)

    @property
    def enabled(self) -> bool:
        return bool(self._by_hash)

    def lookup(self, api_key: str) -> KeyPolicy | None:
        return self._by_hash.get(hash_key(api_key))


def load_key_file(path: Path) -> list[KeyFileEntry]:
    try:
        raw = json.loads(path.read_text())
        return TypeAdapter(list[KeyFileEntry]).validate_python(raw)
    except (OSError, ValueError, ValidationError) as exc:
        raise KeyFileError(f"TOKENRELAY_API_KEYS_FILE {path}: {exc}") from exc
