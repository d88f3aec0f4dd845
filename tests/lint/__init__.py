"""Tests marked `lint` by tests/conftest.py: see its docstring."""
