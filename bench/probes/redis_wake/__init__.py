"""Redis CPU per request against how busy Redis is (`python -m bench.probes.redis_wake`)."""
