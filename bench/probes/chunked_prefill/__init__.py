"""A long prompt's stall on running streams (`python -m bench.probes.chunked_prefill`)."""
