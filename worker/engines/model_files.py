"""What an engine reads from a model's files besides its weights: the tokenizer and chat
template (transformers' `AutoTokenizer`), the context window, the end-of-sequence ids and the
sampling defaults of `generation_config.json`. For engines that decode token ids only (vLLM's
with `skip_tokenizer_init`), so that our tokenizer, decoder and stop strings stay in charge."""

from __future__ import annotations

import socket
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from tokenrelay.shared.generation import ChatMessage, FunctionTool
from tokenrelay.shared.redis.model_limits import ChatTemplate
from tokenrelay.worker.engines.protocol import IncrementalDecoder, ModelLoadError

_HUB_PROBE_TIMEOUT_S = 5.0


class DecodeStreamDecoder:
    """Incremental text of a token stream (`tokenizers`' DecodeStream)."""

    def __init__(self, backend: Any) -> None:
        from tokenizers.decoders import DecodeStream

        self._backend = backend
        self._stream = DecodeStream(skip_special_tokens=True)

    def step(self, token_id: int) -> str:
        return self._stream.step(self._backend, token_id) or ""


class ModelFiles:
    """A model's tokenizer, limits and defaults (a directory or a hub id)."""

    def __init__(self, model_name: str) -> None:
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        try:
            config = AutoConfig.from_pretrained(model_name)
            self.tokenizer = AutoTokenizer.from_pretrained(model_name)
            generation = GenerationConfig.from_pretrained(model_name)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"could not load model {model_name!r}: {exc}") from exc
        self.max_context_tokens = int(getattr(config, "max_position_embeddings", 2048))
        eos = generation.eos_token_id
        self.eos_ids = sorted(
            {int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None}
        )
        sampling = bool(generation.do_sample)
        self.defaults = (
            float(generation.temperature or 1.0) if sampling else 0.0,
            float(generation.top_p or 1.0),
            int(generation.top_k or 0),
        )

    def encode_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool] = ()
    ) -> list[int]:
        ids: Any = self.tokenizer.apply_chat_template(
            [m.template_form() for m in messages],
            tools=[tool.template_form() for tool in tools] or None,
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return [int(i) for i in ids]

    def encode_prompt(self, prompt: str) -> list[int]:
        return [int(i) for i in self.tokenizer(prompt, add_special_tokens=False)["input_ids"]]

    def new_decoder(self) -> IncrementalDecoder:
        return DecodeStreamDecoder(self.tokenizer.backend_tokenizer)

    def tokenizer_json(self) -> str:
        return str(self.tokenizer.backend_tokenizer.to_str())

    def chat_template(self) -> ChatTemplate | None:
        """The template(s) `encode_chat` renders, and the special tokens transformers passes
        them."""
        source = self.tokenizer.chat_template
        if source is None:
            return None
        templates = dict(source) if isinstance(source, dict) else {"default": source}
        special: dict[str, str | list[str]] = dict(self.tokenizer.special_tokens_map)
        return ChatTemplate(templates=templates, special_tokens=special)


def check_reachable(model_name: str) -> None:
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


class ModelFilesMethods:
    """The `Engine` methods both engines answer from their `ModelFiles` alone."""

    _files: ModelFiles

    def encode_chat(
        self, messages: Sequence[ChatMessage], tools: Sequence[FunctionTool] = ()
    ) -> list[int]:
        return self._files.encode_chat(messages, tools)

    def encode_prompt(self, prompt: str) -> list[int]:
        return self._files.encode_prompt(prompt)

    def sampling_defaults(self) -> tuple[float, float, int]:
        return self._files.defaults

    def new_decoder(self) -> IncrementalDecoder:
        return self._files.new_decoder()

    def tokenizer_json(self) -> str | None:
        return self._files.tokenizer_json()

    def chat_template(self) -> ChatTemplate | None:
        return self._files.chat_template()
