"""Tests marked `unit` by tests/conftest.py: see its docstring."""
