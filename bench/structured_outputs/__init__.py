"""Structured outputs' cost against the same requests unconstrained
(`python -m bench.structured_outputs`)."""
