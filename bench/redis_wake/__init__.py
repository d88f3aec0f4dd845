"""Redis CPU per request against how busy Redis is (`python -m bench.redis_wake`)."""
