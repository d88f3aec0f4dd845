"""Redis cost of one token event (`python -m bench.probes.redis_emit`)."""
