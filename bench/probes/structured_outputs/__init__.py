"""Structured outputs' cost against the same requests unconstrained
(`python -m bench.probes.structured_outputs`)."""
