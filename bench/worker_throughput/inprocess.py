"""Baselines (a) and (b): `model.generate` in this process, no server.

(a) runs the requests one after another. (b) is the first article's approach: every request
gets a thread calling `model.generate` with a `TextIteratorStreamer`, and a consumer that
reads text from the streamer as the article's SSE handler does. All N requests are due at
the run's start, so TTFT includes the time a request waits for the ones before it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from bench.worker_throughput.stats import CpuMeter, RequestTiming, RunResult


def sampling_defaults(model_dir: Path) -> dict[str, Any]:
    """`generate` keyword arguments that sample as the worker does: the checkpoint's
    temperature, top_p and top_k. The worker and transformers' continuous batching do not
    apply the checkpoint's repetition penalty (1.05), so it is switched off here too."""
    from transformers import GenerationConfig

    config = GenerationConfig.from_pretrained(model_dir)
    return {
        "do_sample": True,
        "temperature": config.temperature,
        "top_p": config.top_p,
        "top_k": config.top_k,
        "repetition_penalty": 1.0,
        "pad_token_id": config.pad_token_id,
    }


class LocalModel:
    """The checkpoint loaded with transformers, sampling with the model's own defaults
    (temperature, top_p, top_k) as the worker does, EOS suppressed for `new_tokens`."""

    def __init__(self, model_dir: Path, dtype: str) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer: Any = AutoTokenizer.from_pretrained(model_dir)
        model_class: Any = AutoModelForCausalLM
        self.model: Any = model_class.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self.model.eval()
        self.sampling = sampling_defaults(model_dir)

    def inputs(self, chat: list[dict]) -> dict[str, Any]:
        encoded: Any = self.tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, return_tensors="pt", return_dict=True
        )
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"]}

    def generate(self, inputs: dict[str, Any], new_tokens: int, streamer: Any) -> int:
        """Generate exactly `new_tokens` tokens; returns how many came out."""
        output = self.model.generate(
            **inputs,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            streamer=streamer,
            **self.sampling,
        )
        return int(output.shape[1] - inputs["input_ids"].shape[1])


class _FirstTokenClock:
    """A streamer that only notes when the first generated token arrives (the first `put`
    carries the prompt)."""

    def __init__(self) -> None:
        self.first_token_at: float | None = None
        self._prompt_seen = False

    def put(self, value: Any) -> None:
        if not self._prompt_seen:
            self._prompt_seen = True
        elif self.first_token_at is None:
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


def run_sequential(model: LocalModel, chats: list[list[dict]], new_tokens: int) -> RunResult:
    """(a): one `generate` after another."""
    prepared = [model.inputs(chat) for chat in chats]
    meter = CpuMeter()
    meter.start()
    start = time.perf_counter()
    timings = []
    for inputs in prepared:
        clock = _FirstTokenClock()
        tokens = model.generate(inputs, new_tokens, clock)
        end = time.perf_counter() - start
        first = clock.first_token_at - start if clock.first_token_at is not None else end
        timings.append(RequestTiming(0.0, first, end, tokens))
    wall = time.perf_counter() - start
    return RunResult(tuple(timings), wall, meter.foreign_share())


def run_threaded(model: LocalModel, chats: list[list[dict]], new_tokens: int) -> RunResult:
    """(b): a thread per request calling `generate` with a `TextIteratorStreamer`;
    TTFT is the first non-empty text the streamer yields."""
    from transformers import TextIteratorStreamer

    prepared = [model.inputs(chat) for chat in chats]
    timings: list[RequestTiming | None] = [None] * len(prepared)
    meter = CpuMeter()
    meter.start()
    start = time.perf_counter()

    def serve(index: int) -> None:
        streamer = TextIteratorStreamer(model.tokenizer, skip_prompt=True, skip_special_tokens=True)
        produced: list[int] = []

        def generate() -> None:
            try:
                produced.append(model.generate(prepared[index], new_tokens, streamer))
            except BaseException:
                streamer.end()  # unblock the consumer; the thread reports the error
                raise

        generation = threading.Thread(target=generate)
        generation.start()
        first: float | None = None
        for text in streamer:
            if text and first is None:
                first = time.perf_counter() - start
        generation.join()
        end = time.perf_counter() - start
        tokens = produced[0] if produced else 0
        timings[index] = RequestTiming(0.0, first if first is not None else end, end, tokens)

    handlers = [threading.Thread(target=serve, args=(i,)) for i in range(len(prepared))]
    for handler in handlers:
        handler.start()
    for handler in handlers:
        handler.join()
    wall = time.perf_counter() - start
    done = tuple(t for t in timings if t is not None)
    if len(done) != len(prepared):
        raise RuntimeError(f"{len(prepared) - len(done)} threaded requests did not finish")
    return RunResult(done, wall, meter.foreign_share())
