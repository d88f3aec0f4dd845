"""The demo's model choice and its weights' carriers: the six data packages are read through
their file lists (never imported), joined in order and refused unless Qwen's digest matches;
`--demo` picks the real model where they are installed at the pinned version, says when it
falls back to the tiny one, and gives defaults that explicit settings override."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tokenrelay.shared.settings import DEMO_MODEL_NAME, Settings
from tokenrelay.worker.devmodels import coder_weights
from tokenrelay.worker.devmodels.demo import CODER, DEMO_MAX_TOKENS, TINY, DemoModel
from tokenrelay.worker.engines.protocol import ModelLoadError


def fake_packages(site: Path, version: str, chunks: list[bytes]) -> Path:
    """Distributions named as the demo's, each with one chunk file in its file list."""
    for n, (name, chunk) in enumerate(zip(coder_weights.DISTRIBUTIONS, chunks, strict=True)):
        package = name.replace("-", "_")
        info = site / f"{package}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        data = site / package / "data" / f"part{n + 1:02d}.bin"
        data.parent.mkdir(parents=True)
        data.write_bytes(chunk)
        (site / package / "__init__.py").write_text("raise ImportError('imported a carrier')\n")
        record = [f"{package}/__init__.py,,", f"{package}/data/{data.name},,"]
        (info / "RECORD").write_text("\n".join(record) + "\n")
    return site


def test_the_installed_packages_are_read_through_their_file_lists_never_imported() -> None:
    paths = coder_weights.chunk_paths()
    assert [path.name for path in paths] == [f"part{n:02d}.bin" for n in range(1, 7)]
    assert sum(path.stat().st_size for path in paths) == coder_weights.GGUF_BYTES
    assert not [name for name in sys.modules if name.startswith("pandas_sns")]
    assert coder_weights.installed()
    assert DemoModel.choose("auto") == DemoModel(CODER)


def test_chunks_that_join_into_another_file_are_refused_and_leave_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = fake_packages(tmp_path / "site", "0.9.0", [b"chunk %d " % n for n in range(6)])
    monkeypatch.syspath_prepend(str(site))
    assert coder_weights.installed()
    out = tmp_path / "out"
    with pytest.raises(ModelLoadError, match=r"joined into 48 bytes .* refusing them"):
        coder_weights.join_gguf(out)
    assert list(out.iterdir()) == []


def test_packages_at_another_version_are_not_the_demo_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(fake_packages(tmp_path, "0.8.0", [b"x"] * 6)))
    assert not coder_weights.installed()
    assert DemoModel.choose("auto") == DemoModel(TINY, fell_back=True)
    assert DemoModel.choose("tiny") == DemoModel(TINY)
    with pytest.raises(ModelLoadError, match="needs the demo-model extra"):
        DemoModel.choose("qwen2.5-coder")
    with pytest.raises(ModelLoadError, match=r"is at 0\.8\.0"):
        coder_weights.chunk_paths()


def test_the_demo_defaults_give_way_to_explicit_settings() -> None:
    coder = DemoModel(CODER).apply(Settings(served_model_name="mine"))
    assert (coder.served_model_name, coder.tool_call_parser) == ("mine", "json")
    assert coder.default_max_tokens == DEMO_MAX_TOKENS
    tiny = DemoModel(TINY).apply(Settings(tool_call_parser="hermes", default_max_tokens=64))
    assert (tiny.served_model_name, tiny.tool_call_parser) == (DEMO_MODEL_NAME, "hermes")
    assert (tiny.default_max_tokens, tiny.dtype) == (64, "auto")
    assert DemoModel(TINY).defaults["tool_call_parser"] == "qwen"
