"""The local Qwen2 checkpoint reloads offline with the Auto classes and behaves like Qwen2."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tokenizers.decoders import DecodeStream  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM,
    AutoTokenizer,
    Qwen2ForCausalLM,
    Qwen2Tokenizer,
)

from tokenrelay.worker.devmodels.tiny import (  # noqa: E402
    IM_END,
    IM_START,
    QWEN2_VOCAB_SIZE,
    SPECIAL_TOKENS,
    TINY_SHAPES,
    build_tiny_model,
    qwen2_config,
    qwen_tokenizer,
    train_tokenizer,
)

MIXED_TEXT = "Hello, 世界! 🚀 launch\ttab\nnext line\r\nwindows  two spaces 😀 中文English混合\n"
STREAM_TEXT = "你好🚀\nworld"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Build the "tiny" checkpoint once, with the hub switched off for the whole module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")
        yield build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def tokenizer(checkpoint: Path) -> Any:
    return AutoTokenizer.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def model(checkpoint: Path) -> Any:
    return AutoModelForCausalLM.from_pretrained(checkpoint)


def test_reloads_as_qwen2_classes(tokenizer: Any, model: Any) -> None:
    assert type(model).__name__ == "Qwen2ForCausalLM"
    assert isinstance(model, Qwen2ForCausalLM)
    assert isinstance(tokenizer, Qwen2Tokenizer)
    assert model.dtype == torch.float32
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.tie_word_embeddings
    assert model.config.max_position_embeddings == 2048


def test_special_tokens(tokenizer: Any, model: Any) -> None:
    ids = tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    assert len(set(ids)) == len(SPECIAL_TOKENS)
    assert all(0 <= i < model.config.vocab_size for i in ids)
    endoftext, _, im_end = ids
    assert tokenizer.eos_token == IM_END
    assert tokenizer.eos_token_id == im_end
    assert tokenizer.pad_token_id == endoftext
    assert tokenizer.padding_side == "left"
    for token, token_id in zip(SPECIAL_TOKENS, ids, strict=True):
        assert tokenizer.encode(token) == [token_id]


def test_round_trip_is_exact(tokenizer: Any) -> None:
    ids = tokenizer.encode(MIXED_TEXT)
    assert tokenizer.decode(ids) == MIXED_TEXT


def test_reloaded_tokenizer_matches_trained_one(tokenizer: Any) -> None:
    trained = train_tokenizer()
    text = f"{IM_START}user\n{MIXED_TEXT}{IM_END}\n"
    assert tokenizer.encode(text) == trained.encode(text).ids
    assert len(tokenizer) == trained.get_vocab_size()


def test_chat_template(tokenizer: Any) -> None:
    messages = [{"role": "user", "content": "Hi 🚀"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith(f"{IM_START}system\nYou are a helpful assistant.{IM_END}\n")
    assert prompt.endswith(f"{IM_START}assistant\n")
    assert f"{IM_START}user\nHi 🚀{IM_END}\n" in prompt

    custom = [{"role": "system", "content": "Be brief."}, *messages]
    prompt = tokenizer.apply_chat_template(custom, add_generation_prompt=True, tokenize=False)
    assert prompt.startswith(f"{IM_START}system\nBe brief.{IM_END}\n")
    assert "helpful assistant" not in prompt


def test_decode_stream_reassembles_split_characters(tokenizer: Any) -> None:
    ids = [*tokenizer.encode(STREAM_TEXT), tokenizer.eos_token_id]
    stream = DecodeStream(skip_special_tokens=True)
    chunks = [stream.step(tokenizer.backend_tokenizer, token_id) for token_id in ids]
    assert None in chunks  # 🚀 spans several tokens: nothing is emitted mid-character
    assert "".join(chunk for chunk in chunks if chunk is not None) == STREAM_TEXT


def test_forward_and_generate(tokenizer: Any, model: Any) -> None:
    batch = tokenizer([STREAM_TEXT, "hi"], return_tensors="pt", padding=True)
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (2, batch["input_ids"].shape[1], model.config.vocab_size)

    torch.manual_seed(0)
    out = model.generate(**batch, max_new_tokens=5, min_new_tokens=5)
    new = out[:, batch["input_ids"].shape[1] :]
    assert new.shape == (2, 5)
    assert int(new.max()) < model.config.vocab_size


def test_generation_config_has_qwen2_instruct_defaults(tokenizer: Any, model: Any) -> None:
    gen = model.generation_config
    endoftext, _, im_end = tokenizer.convert_tokens_to_ids(list(SPECIAL_TOKENS))
    assert gen.do_sample is True
    assert gen.temperature == 0.7
    assert gen.top_p == 0.8
    assert gen.top_k == 20
    assert gen.repetition_penalty == 1.05
    assert gen.eos_token_id == [im_end, endoftext]
    assert gen.pad_token_id == endoftext
    assert gen.bos_token_id == endoftext


def test_weights_depend_only_on_seed(checkpoint: Path, tmp_path: Path) -> None:
    weights = (checkpoint / "model.safetensors").read_bytes()
    same = build_tiny_model(tmp_path / "same", seed=0)
    other = build_tiny_model(tmp_path / "other", seed=1)
    assert (same / "model.safetensors").read_bytes() == weights
    assert (other / "model.safetensors").read_bytes() != weights


def test_qwen2_05b_config_matches_qwen2_05b_instruct() -> None:
    assert "qwen2-0.5b" in TINY_SHAPES
    config = qwen2_config("qwen2-0.5b", vocab_size=1254)
    assert config.hidden_size == 896
    assert config.num_hidden_layers == 24
    assert config.num_attention_heads == 14
    assert config.num_key_value_heads == 2
    assert config.intermediate_size == 4864
    assert config.vocab_size == 151936
    assert config.tie_word_embeddings
    assert config.max_position_embeddings == 32768
    assert config.rope_parameters is not None
    assert config.rope_parameters["rope_theta"] == 1_000_000.0
    assert config.rms_norm_eps == 1e-6


@pytest.mark.parametrize(("shape", "head_size"), [("tiny", 16), ("tiny-h32", 32)])
def test_tiny_shapes_differ_only_in_head_size(shape: str, head_size: int) -> None:
    """vLLM's CPU attention needs a head size of 32 or more: "tiny-h32" has it."""
    config = qwen2_config(shape, vocab_size=1254)
    assert config.hidden_size // config.num_attention_heads == head_size
    assert (config.num_hidden_layers, config.num_attention_heads) == (2, 4)
    assert config.vocab_size == 1254


def test_qwen_tokenizer_covers_the_05b_vocabulary_with_chatml() -> None:
    """The bench tokenizer of the qwen2-0.5b shape: every id below the embedding's rows but
    the last few is a token, ChatML's specials at Qwen's ids, and text round-trips."""
    tokenizer = qwen_tokenizer()
    assert 151_643 < tokenizer.get_vocab_size() <= QWEN2_VOCAB_SIZE
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [151_643, 151_644, 151_645]
    text = "Hello, 世界! ✨"
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    with pytest.raises(ValueError, match=r"qwen2-0\.5b shape only"):
        build_tiny_model(Path("/nonexistent"), shape="tiny", tokenizer_name="qwen")


def test_qwen2_config_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="unknown shape"):
        qwen2_config("qwen2-72b", vocab_size=1000)
    with pytest.raises(ValueError, match="exceeds"):
        qwen2_config("qwen2-0.5b", vocab_size=200_000)
