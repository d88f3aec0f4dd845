"""The transformers engine's prefix cache: the KV of whole prompt blocks, kept across jobs.

Each entry is one block's keys and values for every layer, one tensor of shape
`(layers, 2, kv_heads, block_tokens, head_dim)` on the engine's device, named by the
block's chained hash (`shared.prefix_blocks`), so an entry stands for the whole prefix up
to its block's end. Entries are copies, never views of a batch cache: the batch cache is
trimmed, reindexed and concatenated as rows come and go, and a cached block must outlive
all of that. The cache holds at most `budget_bytes` and evicts the least recently used
block first. A lookup or a store touches a prefix's blocks last to first, so a prefix's
first block is its most recent: eviction eats prefixes from their ends and never leaves a
deep block that no lookup can reach (a lookup stops at the first block it lacks).

Keys are stored as the model computed them, rotated for their absolute positions (RoPE),
and a prompt always starts at position 0; a hit is therefore valid at the same positions,
and the engine prefills the rest of the prompt from the position after it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from tokenrelay.shared.prefix_blocks import block_hashes


class PrefixCache:
    def __init__(self, budget_bytes: int, block_tokens: int, namespace: str) -> None:
        """`namespace` names what must match for KV to be shared (model, dtype)."""
        self.budget_bytes = budget_bytes
        self.block_tokens = block_tokens
        self.namespace = namespace
        self.bytes_used = 0
        self._blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        return len(self._blocks)

    def hashes(self, token_ids: list[int]) -> list[bytes]:
        return block_hashes(self.namespace, token_ids, self.block_tokens)

    def match(self, hashes: Sequence[bytes]) -> list[torch.Tensor]:
        """The cached blocks of the longest prefix of `hashes` held here, first first."""
        found: list[torch.Tensor] = []
        for block_hash in hashes:
            block = self._blocks.get(block_hash)
            if block is None:
                break
            found.append(block)
        self._touch(hashes[: len(found)])
        return found

    def store(self, hashes: Sequence[bytes], cache: Any, row: int, first_column: int) -> None:
        """Keep the blocks named by `hashes` that are not held yet, read from row `row` of a
        batch `cache` (a `DynamicCache`) whose token `t` sits at column `first_column + t`
        (a left-padded row's real positions start after its padding). A prefix longer than
        the budget keeps its first blocks: room is made by evicting other blocks, never the
        start of the prefix being stored."""
        size = _block_bytes(cache, self.block_tokens)
        kept = hashes[: self.budget_bytes // size]
        self._touch([h for h in kept if h in self._blocks])
        for index, block_hash in enumerate(kept):
            if block_hash in self._blocks:
                continue
            while self.bytes_used + size > self.budget_bytes:
                _, evicted = self._blocks.popitem(last=False)
                self.bytes_used -= evicted.numel() * evicted.element_size()
            start = first_column + index * self.block_tokens
            columns = slice(start, start + self.block_tokens)
            self._blocks[block_hash] = _copy_block(cache, row, columns)
            self.bytes_used += size
        self._touch(kept)

    def _touch(self, hashes: Sequence[bytes]) -> None:
        for block_hash in reversed(hashes):
            self._blocks.move_to_end(block_hash)


def _block_bytes(cache: Any, block_tokens: int) -> int:
    """What one block of `cache`'s shape and dtype takes: keys and values of every layer."""
    keys = cache.layers[0].keys
    per_layer = 2 * keys.shape[1] * block_tokens * keys.shape[3] * keys.element_size()
    return per_layer * len(cache.layers)


def _copy_block(cache: Any, row: int, columns: slice) -> torch.Tensor:
    """One row's keys and values at `columns` of every layer, as one new tensor."""
    return torch.stack(
        [
            torch.stack((layer.keys[row, :, columns], layer.values[row, :, columns]))
            for layer in cache.layers
        ]
    )


def cache_of(blocks: list[torch.Tensor], config: Any) -> Any:
    """A one-row `DynamicCache` for `model.config` holding `blocks` in order: the start of a
    new sequence's cache, which its prefill extends (with new tensors: the blocks are never
    written to)."""
    from transformers import DynamicCache

    joined = torch.cat(blocks, dim=3)
    layers = [(layer[0].unsqueeze(0), layer[1].unsqueeze(0)) for layer in joined]
    return DynamicCache(layers, config=config)
