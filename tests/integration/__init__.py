"""Tests marked `integration` by tests/conftest.py: see its docstring."""
