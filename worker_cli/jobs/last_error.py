"""The text stored as a job's ``last_error``: what an exception says, in a
form a PostgreSQL text value can hold and of a bounded length."""

from __future__ import annotations

__all__ = ["MAX_ERROR_LENGTH", "describe", "storable"]


#: The longest last_error written (characters): a message longer than this is
#: cut short, saying how long it was. A batch of results is one statement, so
#: an unbounded message (a task raising with a whole response body) would make
#: every result of its batch as large.
MAX_ERROR_LENGTH = 65_536


def describe(error: BaseException) -> str:
    """The text stored as a job's last_error. Never raises: an exception whose
    ``__str__`` fails is described as ``<unprintable ...>``. See :func:`storable`."""
    name = type(error).__name__
    try:
        text = str(error)
    except BaseException:
        text = f"<unprintable {name} object>"
    return storable(f"{name}: {text}" if text else name)


def storable(text: str) -> str:
    """``text`` as a PostgreSQL text value can hold it: NUL characters and lone
    surrogates (refused by the server, they would fail the write of every
    result in the batch) written as escapes, and at most
    :data:`MAX_ERROR_LENGTH` characters."""
    if len(text) > MAX_ERROR_LENGTH:
        cut = text[: MAX_ERROR_LENGTH - 64]
        text = f"{cut}... (cut short: {len(text)} characters in all)"
    return text.encode("utf-8", "backslashreplace").decode().replace("\x00", "\\x00")
