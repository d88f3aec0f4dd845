"""The `tokenrelay` command as a user runs it."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from tokenrelay.cli.harness import tokenrelay_command


@pytest.mark.parametrize("model", ["/nonexistent/model-dir", "Qwen/Qwen2-0.5B-Instruct"])
def test_worker_with_an_unloadable_model_fails_fast_and_names_demo(
    model: str, tmp_path: Path
) -> None:
    env = dict(os.environ, TOKENRELAY_MODEL=model, HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path))
    result = subprocess.run(
        tokenrelay_command("worker"), env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "--demo" in result.stderr
    assert model in result.stderr
    assert "Traceback" not in result.stderr


def test_make_tiny_model_writes_a_loadable_checkpoint(tmp_path: Path) -> None:
    out = tmp_path / "model"
    result = subprocess.run(
        tokenrelay_command("make-tiny-model", str(out)), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (out / name).exists()


def test_hash_key_prints_the_sha256_the_keys_file_holds() -> None:
    result = subprocess.run(
        tokenrelay_command("hash-key", "sk-abc"), capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0
    assert result.stdout.strip() == hashlib.sha256(b"sk-abc").hexdigest()


def test_hash_key_reads_the_key_from_stdin_when_not_given() -> None:
    """A key on the command line lands in the shell's history; piped, it does not."""
    piped = subprocess.run(
        tokenrelay_command("hash-key"), input="sk-abc\n", capture_output=True, text=True, timeout=30
    )
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout.strip() == hashlib.sha256(b"sk-abc").hexdigest()
    empty = subprocess.run(
        tokenrelay_command("hash-key"), input="", capture_output=True, text=True, timeout=30
    )
    assert empty.returncode == 2
    assert empty.stdout == "" and "no key given" in empty.stderr
