"""The installed distribution's version: pyproject.toml is the one place it is written."""

from importlib.metadata import version

VERSION = version("tokenrelay")
