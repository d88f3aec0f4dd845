"""Benchmarks. Run each from the repository root as a module: `python -m bench.<name>`."""
