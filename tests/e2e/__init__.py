"""Tests marked `e2e` by tests/conftest.py: see its docstring."""
