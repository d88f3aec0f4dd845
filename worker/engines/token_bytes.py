"""The UTF-8 bytes of one token, for log probabilities (OpenAI's `bytes`): a byte-level BPE
token (GPT-2's, Qwen2's) can hold part of a character, so its text alone cannot say."""

from __future__ import annotations

from functools import cache
from typing import Any


@cache
def _unicode_to_byte() -> dict[str, int]:
    """The inverse of GPT-2's `bytes_to_unicode`: printable bytes stand for themselves, the
    others for the code points from 256 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


class TokenBytes:
    """Bytes of token ids through a transformers tokenizer, cached per id."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._special = set(tokenizer.all_special_ids)
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        cached = self._cache.get(token_id)
        if cached is None:
            cached = self._cache[token_id] = self._bytes(token_id)
        return cached

    def _bytes(self, token_id: int) -> bytes:
        if token_id not in self._special:
            piece = self._tokenizer.convert_ids_to_tokens(token_id)
            table = _unicode_to_byte()
            if isinstance(piece, str) and piece and all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
        return str(self._tokenizer.decode([token_id])).encode()
