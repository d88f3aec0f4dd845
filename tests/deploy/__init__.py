"""Tests marked `deploy` by tests/conftest.py: see its docstring."""
