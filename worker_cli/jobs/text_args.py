"""Text arguments of the utilities, checked before any SQL: PostgreSQL's
text holds no NUL character, and psycopg sends only UTF-8, which a lone
surrogate is not (``"\\udcff"``: what a byte that is not UTF-8 becomes on a
command line). Either would fail the statement with a raw database or
encoding error; a :class:`~worker_cli.errors.JobSpecError` naming the
argument says what is wrong instead, as the utilities' other checks do."""

from __future__ import annotations

from ..errors import JobSpecError

__all__ = ["check_text"]


def check_text(value: object, field: str) -> None:
    """Refuse ``value`` unless it is None or a string PostgreSQL can store;
    the error names ``field``."""
    if value is None:
        return
    if not isinstance(value, str):
        raise JobSpecError(field, f"is {value!r}; it must be a string or None")
    if "\x00" in value:
        raise JobSpecError(
            field,
            f"contains a NUL character (at {value.index(chr(0))}), which PostgreSQL text "
            "cannot hold",
        )
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise JobSpecError(
            field,
            f"contains a lone surrogate ({value[exc.start]!r}, at {exc.start}), which is not "
            "UTF-8 and cannot be stored",
        ) from None
