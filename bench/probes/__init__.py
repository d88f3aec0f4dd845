"""One-off measurements, each behind a single figure or decision; the claims rest on the
three suites beside this folder (gateway, worker_throughput, chaos)."""
