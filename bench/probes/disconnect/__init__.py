"""Client disconnect to cancelled job, timed (`python -m bench.probes.disconnect`)."""
