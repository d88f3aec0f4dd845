"""The offline demo model: a tiny random-weight Qwen2 built once into the cache folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tokenrelay.worker.tiny_model import build_tiny_model

DEMO_DIR_NAME = "demo-model"


def ensure_demo_model(cache_dir: str) -> Path:
    """The demo model's directory, built on first use (safe against concurrent builders)."""
    target = Path(cache_dir).expanduser() / DEMO_DIR_NAME
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".demo-model-", dir=target.parent))
    build_tiny_model(staging)
    try:
        os.rename(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target
