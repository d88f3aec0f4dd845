"""Where a lone stream's time goes in the transformers engine
(`python -m bench.probes.lone_stream`)."""
