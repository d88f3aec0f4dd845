"""Continue a job on this worker from the tokens its earlier attempts delivered.

When a running job's worker is lost (its lease expired) or hands it over on stop, the job
goes back to the front of its queue (`continue_job` in `shared/redis/lua/library.lua`), and
the worker that starts it next gets, from START, the events its log held before its own
Started event (`job_scripts.StartReply.delivered`). Their token chunks carry the ids of the
tokens they hold (`TokenChunk.token_ids`): the continuation prefills the prompt and those
ids (never the delivered text tokenized again, which may tokenize differently) and generates
only the rest, numbering its events from the seq after its Started event, so the client's
stream goes on with neither a duplicate nor a gap.

The text a job's stop-string matcher and incremental decoder hold back is not in the log:
both are fed the delivered ids again (`resume`), which puts them where they were, so a stop
string spanning the seam is found and a character split across it is whole. A seed cannot
carry over (the engine's generator state is not in Redis): a continuation reseeds with the
same seed, so a seeded job is reproducible only up to its seam. A job under a grammar (a JSON
schema, a forced tool call) continues with its matcher advanced through the delivered tokens
(`Engine.continue_grammar`), so its output still validates; an engine that cannot start a
grammar part-way (vLLM's) fails it with a clear error instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from tokenrelay.shared.errors import GenerationFailed
from tokenrelay.shared.events import TokenChunk, parse_event
from tokenrelay.worker.delivery import FIRST_SEQ, JobLog
from tokenrelay.worker.engines.protocol import IncrementalDecoder, SamplingParams
from tokenrelay.worker.stop_strings import StopStringMatcher


@dataclass(frozen=True)
class Delivered:
    """What a job's earlier attempts delivered: the ids of its tokens, their text, and the
    seq of the continuation's own Started event (its events follow it)."""

    token_ids: tuple[int, ...]
    text: str
    seam_seq: int

    @classmethod
    def from_log(cls, events: tuple[str, ...]) -> Delivered:
        """From the log's events from seq 1 up to the seam, as the log holds them (the
        earlier attempts' Started events among them). Raises `GenerationFailed` when a chunk
        lacks its token ids (a worker from before continuations wrote it)."""
        ids: list[int] = []
        texts: list[str] = []
        for raw in events:
            event = parse_event(raw)
            if not isinstance(event, TokenChunk):
                continue
            if event.token_ids is None or len(event.token_ids) != event.tokens:
                raise GenerationFailed(
                    "the worker running this job was lost, and its delivered tokens' ids are "
                    "not in its log: it cannot continue on another worker"
                )
            ids += event.token_ids
            texts.append(event.text)
        return cls(tuple(ids), "".join(texts), FIRST_SEQ + len(events))

    def job_log(self, job_id: str, reader_channel: str | None) -> JobLog:
        """The continuation's log: its events follow its Started event, its text the
        delivered text."""
        return JobLog(job_id, reader_channel, first_seq=self.seam_seq + 1, prior_text=self.text)

    def params(
        self,
        params: SamplingParams,
        continue_grammar: Callable[[object, Sequence[int]], object],
    ) -> SamplingParams:
        """The sampling of the rest: `max_tokens` and `min_tokens` less what was delivered,
        and a grammar past the delivered tokens (`continue_grammar`, the engine's, which
        raises `GenerationFailed` where it cannot)."""
        done = len(self.token_ids)
        grammar = params.grammar
        if grammar is not None and self.token_ids:
            grammar = continue_grammar(grammar, self.token_ids)
        return replace(
            params,
            max_tokens=params.max_tokens - done,
            min_tokens=max(0, params.min_tokens - done),
            grammar=grammar,
        )

    def resume(self, decoder: IncrementalDecoder, matcher: StopStringMatcher) -> None:
        """Feed the delivered ids through a new job's decoder and stop-string matcher, which
        then hold back what they held at the seam. Raises `GenerationFailed` if they release
        other text than was delivered (a tokenizer other than the earlier worker's)."""
        replayed = matcher.feed("".join(decoder.step(token_id) for token_id in self.token_ids))
        if replayed != self.text or matcher.stopped:
            raise GenerationFailed(
                "the worker running this job was lost, and this worker decodes its delivered "
                "tokens to other text: it cannot continue the job"
            )
