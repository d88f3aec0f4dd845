"""Structured outputs' and forced tool calls' throughput cost: the same requests with and
without their grammar.

The worker's engine in-process (no Redis, no HTTP), at each `--concurrency`: that many
sequences decode under a grammar enforced by xgrammar (`worker.engines.grammar`), then the same
prompts unconstrained, each sequence made to produce exactly as many tokens as its
constrained run did (`min_tokens` = `max_tokens`), in the same run. The batch therefore has
the same shape at every step in both, and the difference is the grammar's per-step cost
alone (batched bitmask fill, mask, accept). Two grammars: `json_schema`, a bounded JSON
schema (a name with `maxLength`, a boolean, a bounded integer, an enum); `tools`, a forced
call (`tool_choice: required`) of one of two functions with bounded parameters, on prompts
whose chat template renders the tools. Each pair runs `--repeats` times, alternating, and
the medians are reported. Prints tokens/s of both, the cost in percent, and the grammar's
time per generated token.

    .venv/bin/python -m bench.probes.structured_outputs [--shape tiny] [--concurrency 8,32]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench.common import ensure_model, log, make_conversations
from tokenrelay.shared.generation import ChatMessage, FunctionTool
from tokenrelay.worker.engines.protocol import SamplingParams
from tokenrelay.worker.engines.transformers_engine import TransformersEngine

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "ok": {"type": "boolean"},
        "score": {"type": "integer", "minimum": 0, "maximum": 100},
        "colour": {"enum": ["red", "green", "blue"]},
    },
    "required": ["name", "ok", "score", "colour"],
    "additionalProperties": False,
}
TOOLS = (
    FunctionTool(
        name="get_weather",
        description="The weather in a city.",
        parameters={
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
        },
    ),
    FunctionTool(
        name="get_time",
        description="The time in a zone.",
        parameters={
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
        },
    ),
)
#: The JSON schema of one call of any of `TOOLS`, as the API builds it for `required`.
CALL_SCHEMA = {
    "anyOf": [
        {
            "type": "object",
            "properties": {"name": {"const": tool.name}, "arguments": tool.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for tool in TOOLS
    ]
}


@dataclass(frozen=True)
class Row:
    kind: str
    concurrency: int
    plain_tokens_per_s: float
    constrained_tokens_per_s: float

    @property
    def cost_percent(self) -> float:
        return 100 * (1 - self.constrained_tokens_per_s / self.plain_tokens_per_s)

    @property
    def grammar_us_per_row_step(self) -> float:
        plain = 1 / self.plain_tokens_per_s
        constrained = 1 / self.constrained_tokens_per_s
        return (constrained - plain) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.probes.structured_outputs")
    parser.add_argument("--shape", default="tiny")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--concurrency", default="8,32")
    parser.add_argument("--max-tokens", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", type=Path, default=Path(".cache/bench"))
    args = parser.parse_args()
    model_dir = ensure_model(args.cache_dir.resolve(), args.shape)
    engine = TransformersEngine(str(model_dir), args.device, args.dtype)
    grammars = {
        "json_schema": (engine.compile_grammar(json.dumps(SCHEMA)), ()),
        "tools": (engine.compile_grammar(json.dumps(CALL_SCHEMA), tool_call=True), TOOLS),
    }
    _, top_p, top_k = engine.sampling_defaults()
    rows = []
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        for kind, (grammar, tools) in grammars.items():
            constrained = [
                SamplingParams(args.max_tokens, 0, 1.0, top_p, top_k, seed=0, grammar=grammar)
            ] * concurrency
            lengths, _ = _run(engine, constrained, tools)  # warm-up
            plain = [SamplingParams(n, n, 1.0, top_p, top_k, seed=0) for n in lengths]
            plain_rates, constrained_rates = [], []
            for _ in range(args.repeats):
                constrained_rates.append(_run(engine, constrained, tools)[1])
                plain_rates.append(_run(engine, plain, tools)[1])
            row = Row(
                kind,
                concurrency,
                statistics.median(plain_rates),
                statistics.median(constrained_rates),
            )
            log(
                f"{kind}, {concurrency} concurrent: {row.plain_tokens_per_s:.1f} vs "
                f"{row.constrained_tokens_per_s:.1f} tok/s"
            )
            rows.append(row)
    print(_table(rows, args))
    return 0


def _run(
    engine: TransformersEngine, params: list[SamplingParams], tools: tuple[FunctionTool, ...]
) -> tuple[list[int], float]:
    """Each sequence's token count, and tokens/s over the run."""
    chats = make_conversations(len(params), 64, "structured", engine.tokenizer)
    for i, (chat, p) in enumerate(zip(chats, params, strict=True)):
        messages = [ChatMessage(role=m["role"], content=m["content"]) for m in chat]
        engine.add(f"s{i}", engine.encode_chat(messages, tools), dataclasses.replace(p, seed=i))
    counts = [0] * len(params)
    finished = 0
    started = time.perf_counter()
    while finished < len(params):
        for output in engine.step():
            index = int(output.seq_id[1:])
            counts[index] += output.token_id is not None
            finished += output.finish_reason is not None
    return counts, sum(counts) / (time.perf_counter() - started)


def _table(rows: list[Row], args: argparse.Namespace) -> str:
    load = os.getloadavg()[0]
    lines = [
        f"{args.shape} ({args.dtype}, {args.device}, temperature 1): the same prompts under "
        "a grammar (xgrammar) and unconstrained with the same reply lengths, medians of "
        f"{args.repeats} alternating runs; load average {load:.1f}.",
        "",
        "| grammar | concurrent | plain tok/s | constrained tok/s | cost | grammar us per token |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row.kind} | {row.concurrency} | {row.plain_tokens_per_s:.1f} | "
            f"{row.constrained_tokens_per_s:.1f} | {row.cost_percent:.1f} % | "
            f"{row.grammar_us_per_row_step:.0f} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
