"""Gateway overhead: what tokenrelay adds per stream and per token (`python -m bench.gateway`)."""
