"""The `Engine` seam between the job runner and a model, and its transformers implementation.

An engine turns a chat into prompt token ids, then yields generated token ids one decoding
step at a time, checking `should_stop` between steps. It stops by itself at an end-of-
sequence token (not yielded) or after `max_tokens`. A vLLM engine can implement the same
protocol later.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from shared.generation import ChatMessage


@dataclass(frozen=True)
class SamplingParams:
    """Per-job sampling. `temperature == 0` is greedy; `top_k == 0` disables top-k;
    end-of-sequence cannot be sampled before `min_tokens` tokens."""

    max_tokens: int
    min_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int | None


class IncrementalDecoder(Protocol):
    def step(self, token_id: int) -> str:
        """Text completed by this token; '' while a multi-byte character is still partial."""
        ...


class Engine(Protocol):
    max_context_tokens: int

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]: ...

    def sampling_defaults(self) -> tuple[float, float, int]:
        """The model's own (temperature, top_p, top_k), used where a request is silent."""
        ...

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, should_stop: Callable[[], bool]
    ) -> Iterator[int]: ...

    def new_decoder(self) -> IncrementalDecoder: ...


_HUB_PROBE_TIMEOUT_S = 5.0


class ModelLoadError(RuntimeError):
    """The configured model could not be loaded."""


class _DecodeStreamDecoder:
    def __init__(self, backend: Any) -> None:
        from tokenizers.decoders import DecodeStream

        self._backend = backend
        self._stream = DecodeStream(skip_special_tokens=True)

    def step(self, token_id: int) -> str:
        return self._stream.step(self._backend, token_id) or ""


class TransformersEngine:
    """A causal LM from `transformers`, decoding one sequence with a KV cache."""

    def __init__(self, model_name: str, device: str = "auto", dtype: str = "auto") -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._torch = torch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = device
        if dtype == "auto":
            dtype = "bfloat16" if self.device == "cuda" else "float32"
        _check_reachable(model_name)
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(model_name)
            model_class: Any = AutoModelForCausalLM
            self.model: Any = model_class.from_pretrained(model_name, dtype=getattr(torch, dtype))
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"could not load model {model_name!r}: {exc}") from exc
        self.model.to(self.device).eval()
        config = self.model.config
        self.max_context_tokens = int(getattr(config, "max_position_embeddings", 2048))
        generation = self.model.generation_config
        eos = generation.eos_token_id
        eos_ids = eos if isinstance(eos, list) else [eos]
        self._eos_ids = frozenset(int(i) for i in eos_ids if i is not None)
        self._eos_index = torch.tensor(sorted(self._eos_ids), device=self.device)
        sampling = bool(generation.do_sample)
        self._defaults = (
            float(generation.temperature or 1.0) if sampling else 0.0,
            float(generation.top_p or 1.0),
            int(generation.top_k or 0),
        )

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        chat = [{"role": m.role, "content": m.content} for m in messages]
        ids: Any = self.tokenizer.apply_chat_template(
            chat, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return [int(i) for i in ids]

    def sampling_defaults(self) -> tuple[float, float, int]:
        return self._defaults

    def new_decoder(self) -> IncrementalDecoder:
        return _DecodeStreamDecoder(self.tokenizer.backend_tokenizer)

    def generate(
        self, prompt_ids: list[int], params: SamplingParams, should_stop: Callable[[], bool]
    ) -> Iterator[int]:
        torch = self._torch
        generator = torch.Generator(device=self.device)
        generator.manual_seed(params.seed if params.seed is not None else _random_seed())
        with torch.inference_mode():
            inputs = torch.tensor([prompt_ids], device=self.device)
            output = self.model(input_ids=inputs, use_cache=True)
            for produced in range(params.max_tokens):
                if should_stop():
                    return
                logits = output.logits[0, -1, :]
                if produced < params.min_tokens:
                    logits = logits.index_fill(0, self._eos_index, float("-inf"))
                token = self._sample(logits, params, generator)
                if token in self._eos_ids:
                    return
                yield token
                if produced + 1 == params.max_tokens:
                    return
                output = self.model(
                    input_ids=torch.tensor([[token]], device=self.device),
                    cache=output.cache,
                    use_cache=True,
                )

    def _sample(self, logits: Any, params: SamplingParams, generator: Any) -> int:
        torch = self._torch
        logits = logits.float()
        if params.temperature == 0:
            return int(torch.argmax(logits))
        logits = logits / params.temperature
        if 0 < params.top_k < logits.shape[-1]:
            kth = torch.topk(logits, params.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs > params.top_p
            sorted_probs = sorted_probs.masked_fill(outside, 0.0)
            probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=generator))


def _check_reachable(model_name: str) -> None:
    """Fail in seconds, not after the hub client's minute of retries, when a model that is
    neither a local directory nor in the Hugging Face cache cannot be downloaded."""
    if Path(model_name).is_dir():
        return
    from huggingface_hub import constants, try_to_load_from_cache

    try:
        cached = try_to_load_from_cache(model_name, "config.json")
    except ValueError as exc:
        raise ModelLoadError(
            f"could not load model {model_name!r}: not a local directory and not a hub id ({exc})"
        ) from exc
    if isinstance(cached, str):
        return
    if constants.HF_HUB_OFFLINE:
        raise ModelLoadError(
            f"could not load model {model_name!r}: it is not a local directory, not in the "
            "Hugging Face cache, and HF_HUB_OFFLINE is set"
        )
    endpoint = urlparse(constants.ENDPOINT)
    host = endpoint.hostname or "huggingface.co"
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((host, port), timeout=_HUB_PROBE_TIMEOUT_S).close()
    except OSError as exc:
        raise ModelLoadError(
            f"could not load model {model_name!r}: it is not a local directory, not in the "
            f"Hugging Face cache, and {host} cannot be reached ({exc})"
        ) from exc


def _random_seed() -> int:
    return int.from_bytes(os.urandom(8), "little") & ((1 << 63) - 1)
