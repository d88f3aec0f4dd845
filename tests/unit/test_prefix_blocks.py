"""Block hashes name whole prefixes: chained from the start, within one namespace."""

from __future__ import annotations

from tokenrelay.api.openai.schema import CompletionUsage
from tokenrelay.shared.events import Done, Usage, parse_event
from tokenrelay.shared.prefix_blocks import block_hashes

IDS = list(range(100, 140))  # five blocks of 8


def test_only_whole_blocks_have_a_hash() -> None:
    assert len(block_hashes("m", IDS, 8)) == 5
    assert len(block_hashes("m", IDS[:39], 8)) == 4
    assert block_hashes("m", IDS[:7], 8) == []


def test_a_blocks_hash_covers_every_block_before_it() -> None:
    base = block_hashes("m", IDS, 8)
    changed = block_hashes("m", [999, *IDS[1:]], 8)
    assert all(a != b for a, b in zip(base, changed, strict=True)), "block 0 changed: all differ"
    tail = block_hashes("m", [*IDS[:16], 999, *IDS[17:]], 8)
    assert tail[:2] == base[:2] and all(a != b for a, b in zip(base[2:], tail[2:], strict=True))
    assert block_hashes("m", IDS[:24], 8) == base[:3], "a prefix's hashes start a longer one's"


def test_another_namespace_never_shares_a_hash() -> None:
    assert not set(block_hashes("model-a|bf16", IDS, 8)) & set(block_hashes("model-b|bf16", IDS, 8))
    assert not set(block_hashes("m|bf16", IDS, 8)) & set(block_hashes("m|fp32", IDS, 8))


def test_a_done_event_stored_before_cached_tokens_existed_still_parses() -> None:
    old = (
        '{"type":"done","seq":9,"finish_reason":"stop",'
        '"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}'
    )
    event = parse_event(old)
    assert isinstance(event, Done) and event.usage.cached_tokens == 0


def test_openai_usage_reports_cached_tokens_as_prompt_tokens_details() -> None:
    usage = Usage(prompt_tokens=40, completion_tokens=2, total_tokens=42, cached_tokens=32)
    assert CompletionUsage.of(usage).model_dump() == {
        "prompt_tokens": 40,
        "completion_tokens": 2,
        "total_tokens": 42,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
