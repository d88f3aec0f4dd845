"""Structured outputs: a JSON schema enforced while decoding, one matcher per sequence.

xgrammar (what vLLM uses by default) compiles the schema against the tokenizer's vocabulary
once per distinct schema (its compiler caches), and each step a sequence's matcher fills a
bitmask of the tokens that keep the output a valid prefix; masked tokens get -inf before
sampling, so penalties, biases, temperature and top-k/top-p act on valid tokens only. Chosen
over llguidance for its torch-native bitmask application (CPU and CUDA alike) and its
`any_whitespace=False` mode: the grammar allows no whitespace between tokens, so a model
cannot loop on spaces and newlines between fields (the failure of permissive JSON grammars
that made vLLM turn free whitespace off). A schema whose fields are bounded (enums, booleans,
bounded numbers, strings with `maxLength`) therefore always closes; once the document is
complete, only end-of-sequence is allowed. xgrammar's string rule lets raw control
characters through, which JSON forbids (they must be escaped), so tokens holding a byte
below 0x20 are masked as well: with no free whitespace, a valid document never needs one.

Each step masks all constrained rows of the batch at once (`GrammarCompiler.mask_rows`): one
bitmask for them all, filled by xgrammar's `BatchGrammarMatcher` across threads, applied to
their logits in one call, and the control-character mask in one more; rows without a
grammar are not touched.

A forced tool call (`tool_choice` `required` or a named function) is the same JSON grammar
between the literals `<tool_call>` and `</tool_call>` (Qwen2's tool-call format, without
its newlines, which the control-character mask would forbid).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from tokenrelay.shared.errors import GenerationFailed, InvalidRequest


class GrammarCompiler:
    """Compiles JSON schemas for one tokenizer; `matcher` starts one sequence's state, and
    `mask_rows` masks a step's constrained rows together."""

    def __init__(
        self,
        tokenizer: Any,
        vocab_size: int,
        stop_ids: list[int],
        token_bytes: Callable[[int], bytes],
    ) -> None:
        import xgrammar

        info = xgrammar.TokenizerInfo.from_huggingface(
            tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids
        )
        self._compiler = xgrammar.GrammarCompiler(info)
        self._vocab_size = vocab_size
        self._control = torch.tensor(
            [
                i
                for i in range(len(tokenizer))
                if i < vocab_size and i not in stop_ids and min(token_bytes(i), default=32) < 32
            ],
            dtype=torch.long,
        )
        self._batch = xgrammar.BatchGrammarMatcher()
        self._bitmask = xgrammar.allocate_token_bitmask(1, vocab_size)

    def compile(self, json_schema: str, tool_call: bool = False) -> Any:
        """The compiled grammar; `InvalidRequest` (400) for a schema xgrammar refuses."""
        return self._compiler.compile_grammar(grammar_of(json_schema, tool_call))

    def matcher(self, grammar: Any) -> GrammarState:
        """A new sequence's position in `grammar`: its start, or for a `ContinuedGrammar`
        the position past its delivered tokens."""
        if isinstance(grammar, ContinuedGrammar):
            return grammar.state
        return GrammarState(grammar)

    def continued(self, compiled: Any, delivered: Sequence[int]) -> ContinuedGrammar:
        """`compiled` for a continuation past `delivered`; `GenerationFailed` if it refuses
        one of them (a worker whose grammar engine differs from the earlier worker's)."""
        state = GrammarState(compiled)
        for token in delivered:
            if not state.matcher.accept_token(token):
                raise GenerationFailed(
                    "the worker running this job was lost, and this worker's grammar refuses "
                    "the tokens already delivered: it cannot continue the job"
                )
        return ContinuedGrammar(state)

    def mask_rows(self, states: list[GrammarState], logits: torch.Tensor) -> torch.Tensor:
        """`logits` (row `i` is `states[i]`'s, a tensor the caller owns) with every token
        each row's grammar forbids at -inf, in place."""
        import xgrammar

        if self._bitmask.shape[0] < len(states):
            self._bitmask = xgrammar.allocate_token_bitmask(len(states), self._vocab_size)
        bitmask = self._bitmask[: len(states)]
        self._batch.batch_fill_next_token_bitmask([state.matcher for state in states], bitmask)
        xgrammar.apply_token_bitmask_inplace(
            logits, bitmask.to(logits.device), vocab_size=self._vocab_size
        )
        if self._control.device != logits.device:
            self._control = self._control.to(logits.device)
        logits[:, self._control] = float("-inf")
        return logits


TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"


def grammar_of(json_schema: str, tool_call: bool = False) -> Any:
    """The xgrammar `Grammar` of documents valid for `json_schema` (with `tool_call`, one
    tool call holding such a document); `InvalidRequest` (400) where xgrammar refuses it."""
    import xgrammar

    try:
        document = xgrammar.Grammar.from_json_schema(
            json_schema, any_whitespace=False, strict_mode=True
        )
    except (RuntimeError, ValueError, TypeError) as exc:
        field = "tools" if tool_call else "response_format"
        raise InvalidRequest(
            f"`{field}` has a JSON schema that cannot be enforced: {exc}", param=field
        ) from None
    if not tool_call:
        return document
    return xgrammar.Grammar.concat(
        xgrammar.Grammar.from_ebnf(f"root ::= {json.dumps(TOOL_CALL_OPEN)}"),
        document,
        xgrammar.Grammar.from_ebnf(f"root ::= {json.dumps(TOOL_CALL_CLOSE)}"),
    )


@dataclass(frozen=True)
class ContinuedGrammar:
    """One continuation's position in its grammar, already past the tokens delivered before
    the seam (`GrammarCompiler.continued`): its job's row starts from it."""

    state: GrammarState


class GrammarState:
    """One sequence's position in its grammar."""

    def __init__(self, compiled: Any) -> None:
        import xgrammar

        self.matcher = xgrammar.GrammarMatcher(compiled)

    def accept(self, token: int) -> None:
        if not self.matcher.accept_token(token):
            raise RuntimeError(f"the grammar refused token {token} it allowed")

    @property
    def finished(self) -> bool:
        return bool(self.matcher.is_terminated())
