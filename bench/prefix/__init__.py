"""Prefix reuse across workers: multi-turn TTFT, hit rate and balance (`python -m bench.prefix`)."""
