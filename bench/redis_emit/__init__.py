"""Redis cost of one token event (`python -m bench.redis_emit`)."""
