"""The one place that makes what the backend writes for a task storable,
before any SQL: its arguments and return value (``json`` columns), the
errors of its attempts (a ``jsonb`` column) and the worker ids.

* Arguments and return values go through Django's ``normalize_json`` and
  ``json.dumps`` with ASCII escapes, so any text survives exactly: the
  ``json`` type keeps ``\\u0000`` and lone surrogates as written, and they
  read back as given. What does not survive JSON (a ``set``, NaN) is a
  ``TypeError`` naming it.
* An error is whatever the task raised, described without trusting it
  (``str()`` raising, any class, any size), with NUL written ``\\x00`` and
  lone surrogates ``\\udc80`` (``jsonb`` refuses both), and bounded: the
  exception's own lines at most :data:`MAX_MESSAGE` characters, the whole
  traceback at most :data:`MAX_TRACEBACK`, the middle left out and said so.
  A result keeps :data:`MAX_ERRORS` errors: the first and the latest.
"""

from __future__ import annotations

import json
import traceback
from typing import Any

from django.utils.json import normalize_json

__all__ = [
    "MAX_CLASS_PATH",
    "MAX_ERRORS",
    "MAX_MESSAGE",
    "MAX_TRACEBACK",
    "error_of",
    "error_record",
    "errors_json",
    "json_text",
    "kept_errors",
    "storable_text",
]

#: The characters kept of an error's traceback (its message included).
MAX_TRACEBACK = 16_000
#: The characters kept of the exception's own lines (``ValueError: ...``),
#: the end of the traceback.
MAX_MESSAGE = 4_000
#: The characters kept of an exception's class path.
MAX_CLASS_PATH = 1_000
#: The errors a result keeps: its first, and the latest ``MAX_ERRORS - 1``.
MAX_ERRORS = 100


def storable_text(text: str, limit: int | None = None) -> str:
    """``text`` as PostgreSQL stores it in text and jsonb: NUL written
    ``\\x00``, lone surrogates ``\\udXXX``; at most ``limit`` characters
    (the middle left out, and said so)."""
    if limit is not None:
        text = _middle_out(text, limit)
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text if limit is None else _middle_out(text, limit)


def _middle_out(text: str, limit: int) -> str:
    """``text``, or its start and end around a note of how much was left out
    (``limit`` characters in all; the end, where the latest lines and the
    message's end are, gets three quarters)."""
    if len(text) <= limit:
        return text
    keep = limit
    while True:  # the note's length depends on the count it gives
        note = f"\n[... {len(text) - keep:,} characters left out ...]\n"
        if keep + len(note) <= limit or keep == 0:
            break
        keep = max(limit - len(note), 0)
    if keep + len(note) > limit:  # a limit shorter than the note
        return text[:limit]
    head = keep // 4
    return text[:head] + note + text[len(text) - (keep - head) :]


def error_record(exception_class_path: str, traceback_text: str) -> dict[str, str]:
    """One element of a row's ``errors`` (Django's TaskError's fields), storable."""
    return {
        "exception_class_path": storable_text(exception_class_path, MAX_CLASS_PATH),
        "traceback": storable_text(traceback_text, MAX_TRACEBACK),
    }


def error_of(exc: BaseException) -> dict[str, str]:
    """The error record of ``exc``, whatever it is: its class path and its
    traceback (its frames, then its own lines; each part bounded)."""
    try:
        kind = type(exc)
        path = f"{_text(kind.__module__)}.{_text(kind.__qualname__)}"
    except BaseException:  # a metaclass's property raising
        path = "builtins.BaseException"
    try:
        described = traceback.TracebackException.from_exception(exc)
        message = "".join(described.format_exception_only())
        whole = "".join(described.format())
    except BaseException as failed:  # the traceback module gave up on it
        message = f"{path}: <the error could not be described: {type(failed).__name__}>\n"
        whole = message
    stack = whole.removesuffix(message) if whole.endswith(message) else whole
    message = storable_text(message, MAX_MESSAGE)
    stack = storable_text(stack, MAX_TRACEBACK - len(message))
    return error_record(path, stack + message)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else repr(value)


def kept_errors(errors: list[dict[str, str]]) -> list[dict[str, str]]:
    """The errors a result keeps: all, or the first and the latest
    (:data:`MAX_ERRORS` in all), as the statements that append one keep them."""
    if len(errors) <= MAX_ERRORS:
        return errors
    return [errors[0], *errors[len(errors) - MAX_ERRORS + 1 :]]


def errors_json(errors: list[dict[str, str]]) -> str:
    """The JSON text of error records (for the jsonb ``errors`` column)."""
    return json.dumps(errors)


def json_text(value: Any, what: str) -> tuple[Any, str]:
    """``value`` as Django's JSON normalisation gives it, and its JSON text
    for a ``json`` column; a ``TypeError`` naming ``what`` if JSON cannot
    carry it (NaN and the infinities too, which PostgreSQL refuses)."""
    normalized = normalize_json(value)
    try:
        return normalized, json.dumps(normalized, allow_nan=False)
    except ValueError as exc:
        raise TypeError(f"Unsupported {what} value: {exc}") from None
