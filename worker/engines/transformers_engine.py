"""A transformers causal LM decoding many sequences in shared forward passes.

The batch lives in one `DynamicCache`, left-padded: row `i` holds sequence `i`'s keys and
values right-aligned, and `_mask` marks its real positions. Each step is either a prefill
of sequences waiting to join (one padded forward that computes logits at the last
position only, which give each its first token) whose cache is then merged into the
batch, or one decode step for the whole batch. A prefill step takes at most
`max_prefill_tokens` prompt tokens, padding included: short prompts share one step up to
that, and a longer prompt is prefilled alone in chunks of that size, in its own cache, and
joins the batch with its last chunk. When prefill and decode both have work they alternate:
arrivals and long prompts cannot stall the running sequences (each waits at most one bounded
prefill per token), and a sequence waiting to join waits at most one decode step. Finished
or removed rows are dropped at once (`index_select`), and padding columns no row needs any
more are trimmed, so the cache never holds more than the longest row.

With a prefix cache (`worker.engines.prefix_cache`, `prefix_cache_bytes` > 0), every
prefill keeps the KV of its whole prompt blocks (each chunk of a long prompt as it is
prefilled), and a sequence whose prompt starts with cached blocks, looked up when its
prefill comes, starts from them: it is prefilled alone, as a chunked prompt's next chunk is,
from the position after the hit. The hit leaves at least the prompt's last token to prefill,
whose logits give the first token. Only a forward pass that completed stores anything, so a
sequence removed or failed part-way leaves no partial block.

A bfloat16 model on a CPU with bfloat16 instructions runs its linear layers on oneDNN's
prepacked weights (`worker.engines.packed_linear`) unless `pack_bf16` is off; float32 is
untouched.

HOT PATH (docs/architecture.md, "The per-token path"): measure with
`python -m bench.worker_throughput` before and after changing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from tokenrelay.worker.engines.grammar import GrammarCompiler, GrammarState
from tokenrelay.worker.engines.logits_processor import LogitsProcessor
from tokenrelay.worker.engines.model_files import ModelFiles, ModelFilesMethods, check_reachable
from tokenrelay.worker.engines.packed_linear import can_pack, pack_linears
from tokenrelay.worker.engines.prefix_cache import PrefixCache, cache_of
from tokenrelay.worker.engines.protocol import ModelLoadError, SamplingParams, TokenOutput
from tokenrelay.worker.engines.sampling import new_generator, raw_logprob, sample_token
from tokenrelay.worker.engines.token_bytes import TokenBytes


@dataclass
class _Row:
    seq_id: str
    params: SamplingParams
    generator: torch.Generator
    processor: LogitsProcessor
    grammar: GrammarState | None
    length: int
    produced: int = 0
    last_token: int = 0


@dataclass
class _Joiner:
    seq_id: str
    prompt_ids: list[int]
    params: SamplingParams
    #: Prompt tokens already in `cache` (a prompt prefilled in chunks, or a prefix hit).
    prefilled: int = 0
    cache: Any = None
    #: The prompt's block hashes, once its prefix has been looked up (with a prefix cache).
    hashes: list[bytes] | None = None
    #: Prompt tokens whose KV came from the prefix cache.
    cached: int = 0


class TransformersEngine(ModelFilesMethods):
    def __init__(
        self,
        model_name: str,
        device: str = "auto",
        dtype: str = "auto",
        max_prefill_tokens: int = 2048,
        pack_bf16: bool = True,
        prefix_cache_bytes: int = 0,
        prefix_block_tokens: int = 16,
    ) -> None:
        from transformers import AutoModelForCausalLM

        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        if dtype == "auto":
            dtype = "bfloat16" if device == "cuda" else "float32"
        check_reachable(model_name)
        self._files = ModelFiles(model_name)
        self.tokenizer = self._files.tokenizer
        try:
            model_class: Any = AutoModelForCausalLM
            self.model: Any = model_class.from_pretrained(model_name, dtype=getattr(torch, dtype))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"could not load model {model_name!r}: {exc}") from exc
        self.model.to(device).eval()
        self.vocab_size = int(self.model.get_output_embeddings().weight.shape[0])
        self.packed_linears = 0
        if pack_bf16 and can_pack(device, self.model.dtype):
            self.packed_linears = pack_linears(self.model)
        # As `generate` does: models whose forward takes `logits_to_keep` compute the output
        # head at the last prompt position only.
        self._prefill_options = (
            {"logits_to_keep": 1} if self.model._supports_logits_to_keep() else {}
        )
        self.max_context_tokens = self._files.max_context_tokens
        eos_ids = self._files.eos_ids
        self._eos_ids = frozenset(eos_ids)
        self._pad_id = int(self.tokenizer.pad_token_id or eos_ids[0])
        self._rows: list[_Row] = []
        self._joiners: list[_Joiner] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None
        self._prefilled_last = False
        self._max_prefill_tokens = max_prefill_tokens
        self._token_bytes = TokenBytes(self.tokenizer)
        self._grammar_compiler: GrammarCompiler | None = None
        self.prefix_cache: PrefixCache | None = None
        if prefix_cache_bytes > 0:
            namespace = f"{model_name}|{self.model.dtype}"
            self.prefix_cache = PrefixCache(prefix_cache_bytes, prefix_block_tokens, namespace)

    def token_bytes(self, token_id: int) -> bytes:
        return self._token_bytes(token_id)

    def compile_grammar(self, json_schema: str, tool_call: bool = False) -> object:
        return self._grammars().compile(json_schema, tool_call)

    def continue_grammar(self, grammar: object, delivered: Sequence[int]) -> object:
        return self._grammars().continued(grammar, delivered)

    def add(self, seq_id: str, prompt_ids: list[int], params: SamplingParams) -> None:
        self._joiners.append(_Joiner(seq_id, prompt_ids, params))

    def remove(self, seq_id: str) -> None:
        self._joiners = [j for j in self._joiners if j.seq_id != seq_id]
        keep = [i for i, row in enumerate(self._rows) if row.seq_id != seq_id]
        if len(keep) != len(self._rows):
            self._keep_rows(keep)

    def step(self) -> list[TokenOutput]:
        with torch.inference_mode():
            if self._joiners and not (self._rows and self._prefilled_last):
                self._prefilled_last = True
                return self._prefill()
            if self._rows:
                self._prefilled_last = False
                return self._decode()
        return []

    def _prefill(self) -> list[TokenOutput]:
        budget = self._max_prefill_tokens
        first = self._joiners[0]
        self._reuse(first)
        if first.prefilled or len(first.prompt_ids) > budget:
            return self._prefill_chunk(first)
        count, width = 0, 0
        for joiner in self._joiners:  # only the first can be part-way prefilled by chunks
            self._reuse(joiner)
            if joiner.prefilled:  # a prefix hit: prefilled alone, when it comes first
                break
            wider = max(width, len(joiner.prompt_ids))
            if (count + 1) * wider > budget:
                break
            count, width = count + 1, wider
        joiners, self._joiners = self._joiners[:count], self._joiners[count:]
        ids = torch.full((len(joiners), width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((len(joiners), width), dtype=torch.long)
        for i, joiner in enumerate(joiners):
            ids[i, width - len(joiner.prompt_ids) :] = torch.tensor(joiner.prompt_ids)
            mask[i, width - len(joiner.prompt_ids) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        output = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=True,
            **self._prefill_options,
        )
        for i, joiner in enumerate(joiners):
            self._keep_prefix(joiner, output.cache, i, width - len(joiner.prompt_ids))
        rows = [self._new_row(j, len(j.prompt_ids)) for j in joiners]
        self._merge(output.cache, mask, rows)
        return self._sample(rows, output.logits[:, -1, :])

    def _prefill_chunk(self, joiner: _Joiner) -> list[TokenOutput]:
        """The next chunk of a prompt longer than a prefill step; its first token once the
        last chunk is in, nothing before."""
        start = joiner.prefilled
        end = min(start + self._max_prefill_tokens, len(joiner.prompt_ids))
        ids = torch.tensor([joiner.prompt_ids[start:end]], device=self.device)
        mask = torch.ones((1, end), dtype=torch.long, device=self.device)
        positions = torch.arange(start, end, device=self.device).unsqueeze(0)
        output = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            cache=joiner.cache,
            use_cache=True,
            **self._prefill_options,
        )
        joiner.cache, joiner.prefilled = output.cache, end
        self._keep_prefix(joiner, output.cache, 0, 0)
        if end < len(joiner.prompt_ids):
            return []
        self._joiners.remove(joiner)
        row = self._new_row(joiner, end)
        self._merge(output.cache, mask, [row])
        outputs = self._sample([row], output.logits[:, -1, :])
        return [replace(out, cached_tokens=joiner.cached) for out in outputs]

    def _reuse(self, joiner: _Joiner) -> None:
        """Start the joiner from the longest cached prefix of its prompt, but for its last
        token (once: a lookup when its prefill comes finds what earlier prefills stored)."""
        if self.prefix_cache is None or joiner.hashes is not None:
            return
        joiner.hashes = self.prefix_cache.hashes(joiner.prompt_ids)
        usable = (len(joiner.prompt_ids) - 1) // self.prefix_cache.block_tokens
        blocks = self.prefix_cache.match(joiner.hashes[:usable])
        if blocks:
            joiner.cache = cache_of(blocks, self.model.config)
            joiner.prefilled = joiner.cached = len(blocks) * self.prefix_cache.block_tokens

    def _keep_prefix(self, joiner: _Joiner, cache: Any, row: int, first_column: int) -> None:
        """Store the whole blocks of the joiner's prompt that `cache` now holds."""
        if self.prefix_cache is None or joiner.hashes is None:
            return
        tokens = joiner.prefilled or len(joiner.prompt_ids)
        whole = joiner.hashes[: tokens // self.prefix_cache.block_tokens]
        self.prefix_cache.store(whole, cache, row, first_column)

    def _new_row(self, joiner: _Joiner, length: int) -> _Row:
        params = joiner.params
        processor = LogitsProcessor(params, joiner.prompt_ids, self._eos_ids)
        grammar = None
        if params.grammar is not None:
            grammar = self._grammars().matcher(params.grammar)
        generator = new_generator(params.seed, self.device)
        return _Row(joiner.seq_id, params, generator, processor, grammar, length)

    def _grammars(self) -> GrammarCompiler:
        if self._grammar_compiler is None:
            self._grammar_compiler = GrammarCompiler(
                self.tokenizer, self.vocab_size, sorted(self._eos_ids), self._token_bytes
            )
        return self._grammar_compiler

    def _decode(self) -> list[TokenOutput]:
        assert self._mask is not None
        ids = torch.tensor([[row.last_token] for row in self._rows], device=self.device)
        positions = torch.tensor([[row.length] for row in self._rows], device=self.device)
        ones = torch.ones((len(self._rows), 1), dtype=self._mask.dtype, device=self.device)
        self._mask = torch.cat([self._mask, ones], dim=1)
        output = self.model(
            input_ids=ids,
            attention_mask=self._mask,
            position_ids=positions,
            cache=self._cache,
            use_cache=True,
        )
        self._cache = output.cache
        for row in self._rows:
            row.length += 1
        return self._sample(list(self._rows), output.logits[:, -1, :])

    def _sample(self, rows: list[_Row], logits: torch.Tensor) -> list[TokenOutput]:
        """Sample each row's next token; drop rows that finished from the batch."""
        outputs: list[TokenOutput] = []
        finished: set[str] = set()
        masked = self._mask_grammars(rows, logits)
        for i, row in enumerate(rows):
            row_logits = row.processor.adjust(masked.get(i, logits[i]), row.produced)
            token = sample_token(row_logits, row.params, row.generator)
            if row.grammar is not None:
                row.grammar.accept(token)
            if token in self._eos_ids or token in row.params.stop_token_ids:
                outputs.append(TokenOutput(row.seq_id, None, "stop"))
                finished.add(row.seq_id)
                continue
            row.processor.observe(token)
            row.produced += 1
            row.last_token = token
            done = row.produced >= row.params.max_tokens
            logprob = None
            if row.params.logprobs is not None:
                logprob = raw_logprob(logits[i], token, row.params.logprobs)
            outputs.append(TokenOutput(row.seq_id, token, "length" if done else None, logprob))
            if done:
                finished.add(row.seq_id)
        if finished:
            self._keep_rows([i for i, r in enumerate(self._rows) if r.seq_id not in finished])
        return outputs

    def _mask_grammars(self, rows: list[_Row], logits: torch.Tensor) -> dict[int, torch.Tensor]:
        """The constrained rows' logits, by row index, masked by their grammars in one batch
        (on a copy: log probabilities read the raw rows). A mask commutes with the penalties
        and biases applied after it: they leave -inf at -inf."""
        constrained = [(i, row.grammar) for i, row in enumerate(rows) if row.grammar is not None]
        if not constrained:
            return {}
        index = torch.tensor([i for i, _ in constrained], device=logits.device)
        states = [state for _, state in constrained]
        masked = self._grammars().mask_rows(states, logits.index_select(0, index))
        return {i: row for (i, _), row in zip(constrained, masked, strict=True)}

    def _merge(self, cache: Any, mask: torch.Tensor, rows: list[_Row]) -> None:
        if self._mask is None:
            self._cache, self._mask, self._rows = cache, mask, rows
            return
        width = max(self._mask.shape[1], mask.shape[1])
        for old, new in zip(self._cache.layers, cache.layers, strict=True):
            old.keys = torch.cat([_pad_left(old.keys, width, 2), _pad_left(new.keys, width, 2)])
            old.values = torch.cat(
                [_pad_left(old.values, width, 2), _pad_left(new.values, width, 2)]
            )
        self._mask = torch.cat([_pad_left(self._mask, width, 1), _pad_left(mask, width, 1)])
        self._rows.extend(rows)

    def _keep_rows(self, keep: list[int]) -> None:
        if not keep:
            self._rows, self._cache, self._mask = [], None, None
            return
        assert self._mask is not None
        index = torch.tensor(keep, device=self.device)
        mask = self._mask.index_select(0, index)
        first = int(mask.any(dim=0).nonzero()[0])
        for layer in self._cache.layers:
            layer.keys = layer.keys.index_select(0, index)[:, :, first:]
            layer.values = layer.values.index_select(0, index)[:, :, first:]
        self._mask = mask[:, first:]
        self._rows = [self._rows[i] for i in keep]


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = missing
    return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)
