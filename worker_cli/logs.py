"""Logging as the command line does it, for library use:
``worker_cli.logs.configure("json")``. The implementation is
:mod:`worker_cli.observe.log_output`."""

from __future__ import annotations

from .observe.log_output import LOG_FORMATS, JsonFormatter, LogFormat, configure, debug_from_env

__all__ = ["LOG_FORMATS", "JsonFormatter", "LogFormat", "configure", "debug_from_env"]
