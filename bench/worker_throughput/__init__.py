"""Worker throughput against single-process baselines (`python -m bench.worker_throughput`)."""
