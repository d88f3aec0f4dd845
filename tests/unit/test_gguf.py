"""GGUF files as a model source, without converting a real one (the real-model lane does):
a converted directory is found by the file's digest, a file that cannot be converted leaves
nothing that looks converted, and the converted generation config ends on `<|endoftext|>`
as well."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from transformers import AutoTokenizer, GenerationConfig

from tokenrelay.worker.devmodels.tiny import ENDOFTEXT, IM_END
from tokenrelay.worker.engines.gguf import (
    converted_model,
    converted_path,
    end_also_on_end_of_text,
    local_model,
)
from tokenrelay.worker.engines.protocol import ModelLoadError


def test_a_converted_file_is_found_by_its_digest_without_converting_again(tmp_path: Path) -> None:
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF, already converted")
    target = converted_path(str(tmp_path / "cache"), hashlib.sha256(gguf.read_bytes()).hexdigest())
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    assert converted_model(gguf, str(tmp_path / "cache")) == target
    assert local_model(str(gguf), str(tmp_path / "cache")) == str(target)


def test_a_model_that_is_no_gguf_file_is_loaded_as_named(tmp_path: Path) -> None:
    assert local_model("Qwen/Qwen2-0.5B-Instruct", str(tmp_path)) == "Qwen/Qwen2-0.5B-Instruct"
    with pytest.raises(ModelLoadError, match="no such GGUF file"):
        local_model(str(tmp_path / "missing.gguf"), str(tmp_path))


def test_a_file_that_cannot_be_converted_leaves_nothing_that_looks_converted(
    tmp_path: Path,
) -> None:
    gguf = tmp_path / "broken.gguf"
    gguf.write_bytes(b"GGUF" + bytes(64))
    cache = tmp_path / "cache"
    with pytest.raises(ModelLoadError, match="could not convert GGUF file"):
        converted_model(gguf, str(cache))
    leftovers = [path.name for path in (cache / "gguf").iterdir()]
    assert leftovers == [f"{hashlib.sha256(gguf.read_bytes()).hexdigest()}.lock"]


def test_the_generation_config_ends_on_end_of_text_too(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    im_end, end_of_text = tokenizer.convert_tokens_to_ids([IM_END, ENDOFTEXT])
    generation = GenerationConfig(eos_token_id=im_end)
    end_also_on_end_of_text(generation, tokenizer)
    assert generation.eos_token_id == [im_end, end_of_text]
    end_also_on_end_of_text(generation, tokenizer)
    assert generation.eos_token_id == [im_end, end_of_text]
