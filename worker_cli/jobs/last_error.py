"""The text stored as a job's ``last_error``: what an exception says, in a
form a PostgreSQL text value can hold and of a bounded length; and the
traceback kept with each failed attempt's error (:func:`traceback_of`)."""

from __future__ import annotations

import traceback

__all__ = ["MAX_ERROR_LENGTH", "MAX_TRACEBACK_LENGTH", "describe", "storable", "traceback_of"]


#: The longest last_error written (characters): a message longer than this is
#: cut short, saying how long it was. A batch of results is one statement, so
#: an unbounded message (a task raising with a whole response body) would make
#: every result of its batch as large.
MAX_ERROR_LENGTH = 65_536

#: The longest traceback kept with an attempt's error (characters): its last
#: ones, the innermost frames and the exception, are kept.
MAX_TRACEBACK_LENGTH = 8_000


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


def traceback_of(error: BaseException) -> str | None:
    """``error``'s traceback as Python prints it (the exceptions it was raised
    from or during included), kept with the attempt's error: at most its last
    :data:`MAX_TRACEBACK_LENGTH` characters (the innermost frames and the
    exception), after a line saying how much was cut; storable. None for an
    exception that was never raised (no frames) and has no cause or context.
    Never raises."""
    try:
        if error.__traceback__ is None and error.__cause__ is None and error.__context__ is None:
            return None
        text = "".join(traceback.format_exception(error)).rstrip("\n")
    except BaseException:  # a job's exception's own code (its __str__) may raise anything
        return None
    if len(text) > MAX_TRACEBACK_LENGTH:
        kept = text[-MAX_TRACEBACK_LENGTH:]
        kept = kept[kept.find("\n") + 1 :] if "\n" in kept else kept
        text = f"[{len(text) - len(kept)} characters cut: the outermost frames]\n{kept}"
    return storable(text)
