"""Where a lone stream's time goes in the transformers engine (`python -m bench.lone_stream`)."""
