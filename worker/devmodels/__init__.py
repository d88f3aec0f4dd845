"""Offline Qwen2 checkpoints with random weights, for tests, benchmarks and the demo."""
