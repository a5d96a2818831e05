"""The package version (the single source: pyproject.toml reads it from here)."""

__version__ = "0.1.0"
