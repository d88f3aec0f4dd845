"""The garbage collector of a `tokenrelay api` process, tuned for many long streams.

Relaying many streams, CPython's default thresholds (700, 10, 10) added tens of milliseconds
to the inter-token delay at p99, and these settings take most of it away, with less CPU per
token (docs/benchmarks/gateway.md): a relay's garbage is nearly all freed by reference counting,
while each collection walks the objects of every open stream. What is alive once the app is
built (modules, the app) is frozen out of the collections, and the youngest generation is
collected every `YOUNG_THRESHOLD` allocations instead of 700.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000
OLDER_THRESHOLD = 20


def tune() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, OLDER_THRESHOLD, OLDER_THRESHOLD)
