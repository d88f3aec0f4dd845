"""A continuation's view of what its job delivered: ids, text, seam, and the decoder and
stop-string matcher put back where the earlier worker left them."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tokenrelay.shared.errors import GenerationFailed
from tokenrelay.shared.events import Started, TokenChunk
from tokenrelay.shared.redis.plane_scripts import log_payload
from tokenrelay.worker.continuation import Delivered
from tokenrelay.worker.engines.protocol import GRAMMAR_CANNOT_CONTINUE, SamplingParams
from tokenrelay.worker.stop_strings import StopStringMatcher

VOCAB = {1: "Hel", 2: "lo ", 3: "wor", 4: "ld", 5: "EN", 6: "D!"}


class CharDecoder:
    def step(self, token_id: int) -> str:
        return VOCAB[token_id]


def logged(*events: str) -> tuple[str, ...]:
    return tuple(log_payload(seq, event) for seq, event in enumerate(events, start=1))


def chunk(text: str, ids: list[int]) -> str:
    return TokenChunk(text=text, tokens=len(ids), token_ids=ids).to_wire()


def params(**changes: object) -> SamplingParams:
    base = {"max_tokens": 10, "min_tokens": 4, "temperature": 0.0, "top_p": 1.0, "top_k": 0}
    return SamplingParams(**(base | changes), seed=None)  # type: ignore[arg-type]


def test_the_delivered_ids_and_text_come_from_the_token_chunks_and_the_seam_follows_them() -> None:
    earlier = Started(worker="w1", prompt_tokens=3, attempt=2).to_wire()
    delivered = Delivered.from_log(logged(chunk("Hel", [1]), earlier, chunk("lo ", [2])))
    assert delivered == Delivered(token_ids=(1, 2), text="Hello ", seam_seq=4)
    continued = delivered.params(params(), lambda grammar, ids: grammar)
    assert (continued.max_tokens, continued.min_tokens) == (8, 2)
    log = delivered.job_log("j", None)
    assert (log.next_seq, log.text) == (5, "Hello ")


def test_a_stop_string_spanning_the_seam_is_found_after_the_replay() -> None:
    """The earlier matcher held back "EN" (a prefix of the stop string "END!"): not in the log,
    but the replay holds it back again, so the next token completes the stop string."""
    matcher = StopStringMatcher(["END!"])
    delivered = Delivered.from_log(logged(chunk("Hello ", [1, 2]), chunk("", [5])))
    decoder = CharDecoder()
    delivered.resume(decoder, matcher)
    assert matcher.feed(decoder.step(6)) == "" and matcher.stopped


def test_a_replay_that_decodes_to_other_text_fails_the_continuation() -> None:
    delivered = Delivered.from_log(logged(chunk("Goodbye", [1])))
    with pytest.raises(GenerationFailed):
        delivered.resume(CharDecoder(), StopStringMatcher([]))


def test_chunks_without_token_ids_cannot_be_continued() -> None:
    with pytest.raises(GenerationFailed):
        Delivered.from_log(logged(TokenChunk(text="Hel", tokens=1).to_wire()))


def test_a_job_under_a_grammar_continues_past_its_delivered_tokens_where_the_engine_can() -> None:
    continued: list[tuple[object, tuple[int, ...]]] = []

    def advance(grammar: object, delivered: Sequence[int]) -> object:
        continued.append((grammar, tuple(delivered)))
        return "past"

    rest = Delivered.from_log(logged(chunk("{", [1]))).params(params(grammar="g"), advance)
    assert rest.grammar == "past" and continued == [("g", (1,))]
    assert rest.max_tokens == 9
    fresh = Delivered.from_log(()).params(params(grammar="g"), advance)
    assert fresh.grammar == "g" and fresh.max_tokens == 10 and len(continued) == 1


def test_a_job_under_a_grammar_fails_where_the_engine_cannot_continue_it() -> None:
    def cannot(grammar: object, delivered: Sequence[int]) -> object:
        raise GenerationFailed(GRAMMAR_CANNOT_CONTINUE)

    with pytest.raises(GenerationFailed, match="JSON schema") as failed:
        Delivered.from_log(logged(chunk("{", [1]))).params(params(grammar=object()), cannot)
    assert failed.value.message == GRAMMAR_CANNOT_CONTINUE
