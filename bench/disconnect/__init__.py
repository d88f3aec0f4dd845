"""Client disconnect to cancelled job, timed (`python -m bench.disconnect`)."""
