"""Block hashes of a prompt's token ids: the names under which a prefix's KV is cached.

A prompt is cut into whole blocks of `block_tokens` ids from its start (a partial last
block has no hash). Block `i`'s hash covers the namespace and blocks `0..i`, chained: each
hash digests the previous one and the block's ids, so two prompts share block `i`'s hash
only if they agree on everything up to its end, and one hash names a whole prefix. The
namespace (model, dtype; adapters when they come) keeps jobs that must not share KV from
ever matching. It lives in `shared` so that whatever places jobs by prefix computes the
very hashes an engine caches under, from the same ids.
"""

from __future__ import annotations

import hashlib
import struct

_DIGEST_BYTES = 16


def block_hashes(namespace: str, token_ids: list[int], block_tokens: int) -> list[bytes]:
    """The chained hash of each whole block of `token_ids`, first block first."""
    previous = hashlib.blake2b(namespace.encode(), digest_size=_DIGEST_BYTES).digest()
    hashes: list[bytes] = []
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        block = token_ids[start : start + block_tokens]
        digest = hashlib.blake2b(previous, digest_size=_DIGEST_BYTES)
        digest.update(struct.pack(f"<{block_tokens}I", *block))
        previous = digest.digest()
        hashes.append(previous)
    return hashes
