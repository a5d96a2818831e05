"""What the dashboard takes from a URL or a form, checked before it reaches
the database: a value PostgreSQL would refuse (an id beyond ``bigint``, a NUL
character in text, a time beyond the year 9999) is the user's bad input, a
400 or a 404 saying so, not a database error.
"""

from __future__ import annotations

from datetime import UTC, datetime

from ..errors import JobSpecError
from ..jobs.job_spec import check_run_at_range

__all__ = [
    "BIGINT",
    "SMALLINT",
    "BadInput",
    "checked_text",
    "parse_cursor",
    "parse_int",
    "parse_job_id",
    "parse_run_at",
    "parse_time",
    "shown",
]

#: The largest ``bigint`` (job ids) and ``smallint`` (priority, max attempts).
BIGINT = 2**63 - 1
SMALLINT = 32767


class BadInput(ValueError):
    """A value the dashboard cannot use; the message names it."""


def shown(text: str, limit: int = 40) -> str:
    """``text`` quoted for a message, shortened when long."""
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _whole_number(text: str) -> int | None:
    """ASCII digits only (``str.isdigit`` takes ``²`` and other scripts'
    digits, which ``int`` refuses), at most 19 of them (no larger job id)."""
    if not (text.isascii() and text.isdigit() and len(text) <= 19):
        return None
    return int(text)


def parse_job_id(text: str) -> int | None:
    """A job id from the URL, or None when no job can have it."""
    number = _whole_number(text)
    return number if number is not None and 0 < number <= BIGINT else None


def parse_cursor(text: str) -> int:
    """The job list's ``?before=`` cursor (a job id)."""
    number = parse_job_id(text)
    if number is None:
        raise BadInput(f"bad cursor {shown(text)}; showing the newest jobs")
    return number


def checked_text(text: str, name: str) -> str:
    """Text for the database: PostgreSQL's text holds no NUL character."""
    if "\x00" in text:
        raise BadInput(
            f"{name}: {shown(text)} contains a NUL character, which the database cannot store"
        )
    return text


def parse_time(text: str, name: str) -> datetime:
    """``2026-12-01T09:00`` (UTC, as the forms say) or with an offset, within
    the years 1 to 9999 in UTC (the database would take more, but no page
    could show it)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise BadInput(f"{name}: not a date and time: {shown(text)}") from None
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    try:
        moment.astimezone(UTC)
    except OverflowError:
        raise BadInput(f"{name}: {shown(text)} is outside the years 1 to 9999 (UTC)") from None
    return moment


def parse_run_at(text: str) -> datetime:
    """A job's new ``run_at`` (see :func:`parse_time`), one that the job can
    be read back with in any time zone, as ``reschedule_jobs`` requires
    (:func:`~worker_cli.jobs.job_spec.check_run_at_range`)."""
    moment = parse_time(text, "run at")
    try:
        check_run_at_range(moment)
    except JobSpecError as exc:
        raise BadInput(f"run at: {exc.reason}") from None
    return moment


def parse_int(text: str, name: str, low: int, high: int = SMALLINT) -> int | None:
    """An optional whole number between ``low`` and ``high``."""
    if not text.strip():
        return None
    try:
        value = int(text.strip())
    except ValueError:
        raise BadInput(f"{name}: not a whole number: {shown(text)}") from None
    if not low <= value <= high:
        raise BadInput(f"{name}: must be between {low} and {high}, not {value}")
    return value


def form_target(form: dict[str, str], *, missing: str) -> tuple[str, str]:
    """A pause or limit form's kind (``queue`` or ``task``) and name, checked:
    ``missing`` says what to give when the name is empty."""
    kind = form.get("kind", "")
    if kind not in ("queue", "task"):
        raise BadInput(f"kind: choose queue or task, not {shown(kind)}")
    name = checked_text(form.get("name", ""), "name").strip()
    if not name:
        raise BadInput(f"name: {missing}")
    if len(name) > 128:
        raise BadInput(f"name: {shown(name)} is longer than 128 characters")
    return kind, name
