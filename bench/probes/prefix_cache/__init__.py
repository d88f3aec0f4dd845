"""A follow-up turn's TTFT with the prefix cache (`python -m bench.probes.prefix_cache`)."""
