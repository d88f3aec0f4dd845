"""Tests marked `e2e` and `real_model` by tests/conftest.py: see its docstring."""
