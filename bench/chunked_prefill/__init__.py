"""A long prompt's stall on running streams (`python -m bench.chunked_prefill`)."""
