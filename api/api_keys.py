"""API keys and what each may do: owner id, admin flag, in-flight quota, default priority.

Keys come from `TOKENRELAY_API_KEYS` / `TOKENRELAY_ADMIN_API_KEYS` (plain keys, hashed at
start) and from `TOKENRELAY_API_KEYS_FILE`, a JSON list that holds only SHA-256 hashes
(`tokenrelay hash-key KEY` prints one):

    [{"sha256": "<hex>", "name": "team-a", "max_inflight": 4, "priority": "high",
      "admin": false}]

Only hashes are kept in memory. A caller's owner id, which Redis stores next to its jobs
and the request log prints, is an HMAC-SHA256 of its key's hash keyed with
`TOKENRELAY_OWNER_ID_SECRET`: without the secret, an owner id says nothing about the key
(not even its SHA-256, which a keys file holds). During a rotation, the id under
`TOKENRELAY_OWNER_ID_PREVIOUS_SECRET` still owns the jobs made under it.

A key is looked up by comparing its hash with every known hash in constant time
(`hmac.compare_digest`, no early exit), so the time taken says nothing about which
stored hash, or how much of one, a guess came close to.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, TypeAdapter, ValidationError

from tokenrelay.shared.redis.rq_jobs import Priority
from tokenrelay.shared.settings import Settings

log = logging.getLogger(__name__)

OWNER_ID_CHARS = 24


def hash_key(api_key: str) -> str:
    return hashlib.sha256(api_key.encode()).hexdigest()


def owner_id(key_sha256: str, secret: bytes) -> str:
    """The owner id of the key with this SHA-256: a keyed hash, truncated."""
    digest = hmac.new(secret, bytes.fromhex(key_sha256), hashlib.sha256).hexdigest()
    return digest[:OWNER_ID_CHARS]


@dataclass(frozen=True)
class KeyPolicy:
    owner: str
    #: The owner id under the previous secret, during a rotation.
    former_owner: str | None = None
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
        self._policies = [(bytes.fromhex(sha256), policy) for sha256, policy in policies.items()]

    @classmethod
    def from_settings(cls, settings: Settings) -> KeyRing:
        secret = _secret(settings.owner_id_secret)
        previous = (
            _secret(settings.owner_id_previous_secret)
            if settings.owner_id_previous_secret
            else None
        )

        def policy(sha256: str, **fields: Any) -> KeyPolicy:
            former = owner_id(sha256, previous) if previous is not None else None
            return KeyPolicy(owner=owner_id(sha256, secret), former_owner=former, **fields)

        policies = {hash_key(key): policy(hash_key(key)) for key in settings.api_keys}
        for key in settings.admin_api_keys:
            policies[hash_key(key)] = policy(hash_key(key), is_admin=True)
        if settings.api_keys_file:
            for entry in load_key_file(Path(settings.api_keys_file)):
                policies[entry.sha256] = policy(
                    entry.sha256,
                    is_admin=entry.admin,
                    max_inflight=entry.max_inflight,
                    priority=entry.priority,
                )
        if policies and settings.owner_id_secret is None:
            log.warning(
                "TOKENRELAY_OWNER_ID_SECRET is not set: owner ids are an unkeyed hash of each "
                "key's SHA-256; set a secret (docs/operations/security.md)"
            )
        return cls(policies)

    @property
    def enabled(self) -> bool:
        return bool(self._policies)

    def lookup(self, api_key: str) -> KeyPolicy | None:
        """The key's policy; every stored hash is compared, each in constant time."""
        digest = hashlib.sha256(api_key.encode()).digest()
        found = None
        for stored, policy in self._policies:
            if hmac.compare_digest(digest, stored):
                found = policy
        return found


def _secret(value: SecretStr | None) -> bytes:
    return value.get_secret_value().encode() if value is not None else b""


def load_key_file(path: Path) -> list[KeyFileEntry]:
    try:
        raw = json.loads(path.read_text())
        return TypeAdapter(list[KeyFileEntry]).validate_python(raw)
    except (OSError, ValueError, ValidationError) as exc:
        raise KeyFileError(f"TOKENRELAY_API_KEYS_FILE {path}: {exc}") from exc
