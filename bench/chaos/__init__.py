"""Chaos: workers, an API process and Redis killed under load (`python -m bench.chaos`)."""
