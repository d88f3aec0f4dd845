"""The offline demo model: a tiny random-weight Qwen2 built once into the cache folder."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from tokenrelay.worker.devmodels.tiny import build_tiny_model

DEMO_DIR_NAME = "demo-model"


def ensure_demo_model(cache_dir: str, shape: str = "tiny") -> Path:
    """The demo model's directory (of `shape`), built on first use (safe against concurrent
    builders)."""
    name = DEMO_DIR_NAME if shape == "tiny" else f"{DEMO_DIR_NAME}-{shape}"
    target = Path(cache_dir).expanduser() / name
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".demo-model-", dir=target.parent))
    build_tiny_model(staging, shape=shape)
    try:
        os.rename(staging, target)
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
    return target
