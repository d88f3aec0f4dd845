"""GGUF files as a model source: `TOKENRELAY_MODEL=/path/to/model.gguf`.

transformers reads a GGUF of the architectures it knows (qwen2, llama, ...) with the `gguf`
package, dequantized, but slowly: it unpacks every tensor and rebuilds the tokenizer from the
file's vocabulary (most of a minute for a 0.5B model). So a GGUF is converted once into a
transformers directory (bfloat16 safetensors, tokenizer, chat template, generation config)
under `<TOKENRELAY_CACHE_DIR>/gguf/<the file's SHA-256>`, which every engine then loads like
any other directory, in seconds.

The conversion writes into a temporary directory beside its target and renames it once
complete, so a crash leaves nothing that looks converted; a lock file makes workers that
share a cache convert a file once (each conversion holds about six times the file in memory).

Qwen's GGUFs name only `<|im_end|>` as the end of a sequence, and the model sometimes ends
with `<|endoftext|>` instead and talks on past it: the converted generation config ends on
both, as Qwen's own checkpoints do.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tokenrelay.worker.engines.protocol import ModelLoadError

log = logging.getLogger(__name__)

GGUF_SUFFIX = ".gguf"
CONVERTED_DIR = "gguf"
#: The token Qwen's vocabulary ends documents with, a second end of sequence.
END_OF_TEXT = "<|endoftext|>"
_READ_BYTES = 1 << 22
#: Seconds between the conversion's progress lines.
TICK_S = 15.0
#: tqdm reads its options from `TQDM_*` variables whenever a bar is made.
TQDM_DISABLE = "TQDM_DISABLE"


def is_gguf(model: str) -> bool:
    """Whether `TOKENRELAY_MODEL` names a GGUF file (by its suffix)."""
    return model.lower().endswith(GGUF_SUFFIX)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while block := file.read(_READ_BYTES):
            digest.update(block)
    return digest.hexdigest()


def local_model(model: str, cache_dir: str) -> str:
    """What an engine loads for `TOKENRELAY_MODEL`: a GGUF file's converted directory, else
    `model` as it is (a directory or a hub id)."""
    if not is_gguf(model):
        return model
    return str(converted_model(Path(model).expanduser(), cache_dir))


def converted_path(cache_dir: str, sha256: str) -> Path:
    """Where the conversion of the GGUF whose SHA-256 is `sha256` lives."""
    return Path(cache_dir).expanduser() / CONVERTED_DIR / sha256


def is_converted(directory: Path) -> bool:
    """A conversion is complete once its directory exists: it is renamed into place last."""
    return (directory / "config.json").is_file()


def converted_model(gguf: Path, cache_dir: str, sha256: str | None = None) -> Path:
    """The transformers directory of `gguf`, converted on first use; `sha256` is the file's
    digest where the caller already knows it (otherwise it is computed)."""
    if not gguf.is_file():
        raise ModelLoadError(f"could not load model {str(gguf)!r}: no such GGUF file")
    target = converted_path(cache_dir, sha256 or file_sha256(gguf))
    if is_converted(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target.with_name(f"{target.name}.lock")):
        if not is_converted(target):  # another process may have converted it meanwhile
            convert(gguf, target)
    return target


def convert(gguf: Path, target: Path) -> None:
    """Convert `gguf` into the transformers directory `target` (which must not exist)."""
    started = time.monotonic()
    log.info("converting %s into %s, once: this takes a minute or more", gguf, target)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        with _quiet_progress_bars(), _ticking(gguf.name, started):
            _convert_into(gguf, staging, started)
        staging.rename(target)
    except Exception as exc:  # whatever the file's content makes transformers or gguf raise
        raise ModelLoadError(f"could not convert GGUF file {str(gguf)!r}: {exc!r}") from exc
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log.info("converted %s in %.0f s", gguf.name, time.monotonic() - started)


def _convert_into(gguf: Path, out: Path, started: float) -> None:
    import torch
    import transformers

    folder, name = str(gguf.parent), gguf.name
    tokenizer: Any = transformers.AutoTokenizer.from_pretrained(folder, gguf_file=name)
    log.info("converting %s: tokenizer read (%.0f s)", name, time.monotonic() - started)
    options: dict[str, Any] = {}
    if hasattr(transformers, "GgufConfig"):
        # Where transformers can keep GGUF blocks packed (with the `kernels` package), ask
        # for dense weights: those are what is saved. Older releases always dequantize.
        options["quantization_config"] = transformers.GgufConfig(dequantize=True)
    model_class: Any = transformers.AutoModelForCausalLM
    model = model_class.from_pretrained(folder, gguf_file=name, dtype=torch.bfloat16, **options)
    log.info("converting %s: weights dequantized (%.0f s)", name, time.monotonic() - started)
    end_also_on_end_of_text(model.generation_config, tokenizer)
    # A GGUF-loaded model refuses to save while it looks quantized; its weights are dense.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    log.info("converting %s: saved (%.0f s)", name, time.monotonic() - started)


def end_also_on_end_of_text(generation: Any, tokenizer: Any) -> None:
    """Add `<|endoftext|>` to the end-of-sequence ids where the vocabulary has it."""
    end_of_text = tokenizer.convert_tokens_to_ids(END_OF_TEXT)
    if not isinstance(end_of_text, int) or end_of_text == tokenizer.unk_token_id:
        return
    eos = generation.eos_token_id
    ids = [] if eos is None else list(eos) if isinstance(eos, list) else [eos]
    if end_of_text not in ids:
        generation.eos_token_id = [*ids, end_of_text]


@contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@contextmanager
def _ticking(name: str, started: float) -> Iterator[None]:
    """A line every `TICK_S` while the conversion runs, so a silent stage does not look hung."""
    done = threading.Event()

    def tick() -> None:
        while not done.wait(TICK_S):
            log.info("converting %s: %.0f s so far", name, time.monotonic() - started)

    ticker = threading.Thread(target=tick, name="gguf-conversion-ticker", daemon=True)
    ticker.start()
    try:
        yield
    finally:
        done.set()
        ticker.join()


@contextmanager
def _quiet_progress_bars() -> Iterator[None]:
    """transformers' progress bars (its own, and the plain tqdm one of its GGUF reader) redraw
    a line many times a second: in a log file, noise. The stage lines say how it goes."""
    from transformers.utils import logging as transformers_logging

    shown = transformers_logging.is_progress_bar_enabled()
    tqdm_disable = os.environ.get(TQDM_DISABLE)
    transformers_logging.disable_progress_bar()
    os.environ[TQDM_DISABLE] = "1"
    try:
        yield
    finally:
        if shown:
            transformers_logging.enable_progress_bar()
        if tqdm_disable is None:
            del os.environ[TQDM_DISABLE]
        else:
            os.environ[TQDM_DISABLE] = tqdm_disable
