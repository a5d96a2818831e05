"""How values look on the pages: times, ages, rates, states, payloads.

These produce plain text; the templates escape it (Jinja2's autoescaping
is on for every template), so a value holding HTML is shown as text.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from typing import Any

from ..db.timestamps import EARLIEST, LATEST
from ..observe.status_report import format_age

__all__ = ["FILTERS", "length", "pretty_json"]

#: A payload longer than this (pretty-printed) is cut on the job's page.
PAYLOAD_SHOWN = 200_000

#: The states' words as the pages show them: the words every command prints
#: (py_job_state, py_job_status), on the list, a job's page and the Finished
#: view alike; then the badges that are not states.
STATE_LABELS = {
    "waiting": "waiting",
    "scheduled": "scheduled",
    "retrying": "retrying",
    "paused": "paused",
    "running": "running",
    "failed": "failed",
    "succeeded": "succeeded",
    "cancelled": "cancelled",
    "cancel_requested": "asked to cancel",
    "stuck": "stuck",
}


def when(moment: datetime | None) -> str:
    """``2026-11-21 20:49:25 UTC`` (empty for None); a time outside Python's
    years (``-infinity``, BC, ``infinity``) as the bound it lies beyond."""
    if moment is None:
        return ""
    if moment == EARLIEST:
        return "before 0001-01-01 (-infinity or BC)"
    if moment == LATEST:
        return "after 9999-12-31 (infinity or later)"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def iso(moment: datetime | None) -> str:
    return "" if moment is None else moment.astimezone(UTC).isoformat()


def datetime_input(moment: datetime | None) -> str:
    """The value of an ``<input type="datetime-local">``, in UTC."""
    return "" if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S")


def relative(moment: datetime | None, now: datetime) -> str:
    """``3m 12s ago`` or ``in 5m 00s``."""
    if moment is None or moment in (EARLIEST, LATEST):
        return ""
    seconds = (now - moment).total_seconds()
    if abs(seconds) < 1:
        return "now"
    if seconds > 0:
        return f"{format_age(seconds)} ago"
    return f"in {format_age(-seconds)}"


def age(seconds: float | None) -> str:
    """``3m 12s``; ``∞`` for a job due since ``-infinity``."""
    if seconds is None:
        return ""
    return format_age(seconds) if math.isfinite(seconds) else "∞"


def rate(per_second: float | None) -> str:
    """``12.5/s`` (or per minute when slow); empty when unknown."""
    if per_second is None:
        return ""
    if per_second >= 1 or per_second == 0:
        return f"{per_second:,.1f}/s"
    return f"{per_second * 60:,.1f}/min"


def number(value: int | float | None) -> str:
    return "" if value is None else f"{value:,}"


def state_label(state: str | None) -> str:
    return STATE_LABELS.get(state or "", state or "")


def pretty_json(text: str | None) -> str:
    """A payload (``json`` text) indented for reading, cut after
    :data:`PAYLOAD_SHOWN` characters."""
    if text is None:
        return ""
    try:
        pretty = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        pretty = text
    if len(pretty) > PAYLOAD_SHOWN:
        return pretty[:PAYLOAD_SHOWN] + f"\n... ({len(pretty) - PAYLOAD_SHOWN:,} more characters)"
    return pretty


def pretty_result(text: str | None, length: int | None) -> str:
    """A finished job's result (its first characters, ``text``, of ``length``):
    indented like a payload when read whole, else its beginning as stored."""
    if text is None:
        return ""
    if length is None or length <= len(text):
        return pretty_json(text)
    return text[:PAYLOAD_SHOWN] + f"\n... ({length - PAYLOAD_SHOWN:,} more characters)"


def duration(seconds: float | None) -> str:
    """How long a job ran: ``0.25s``, ``42s``, ``3m 12s``."""
    if seconds is None or not math.isfinite(seconds):
        return ""
    if seconds < 10:
        return f"{max(seconds, 0):.2f}s"
    return format_age(seconds)


def size(value: int | None) -> str:
    """``512 B``, ``12.5 kB``, ``3.2 MB``."""
    if value is None:
        return ""
    if value < 1000:
        return f"{value} B"
    if value < 1_000_000:
        return f"{value / 1000:.1f} kB"
    return f"{value / 1_000_000:.1f} MB"


def length(period: timedelta | None) -> str:
    """A limit's window as the forms take it (``pause --for``'s lengths):
    ``1s``, ``10m``, ``2h``, ``1d``, ``1.5s``; empty for None."""
    if period is None:
        return ""
    seconds = period.total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def figure(value: float | None) -> str:
    """A progress's done or total: ``1,250`` for a whole number, else ``12.5``."""
    if value is None or not math.isfinite(value):
        return "" if value is None else str(value)
    if value.is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:,.6g}"


def flags(value: Any) -> str:
    if not value:
        return ""
    if isinstance(value, dict):
        return ", ".join(sorted(value))
    return str(value)


FILTERS = {
    "when": when,
    "iso": iso,
    "datetime_input": datetime_input,
    "relative": relative,
    "age": age,
    "rate": rate,
    "number": number,
    "state_label": state_label,
    "pretty_json": pretty_json,
    "pretty_result": pretty_result,
    "duration": duration,
    "size": size,
    "flags": flags,
    "period": length,
    "figure": figure,
}


def fill_phrase(period: timedelta) -> str:
    """A backfill period as the form takes it (``2d``, ``1h30m``; empty for none)."""
    seconds = int(period.total_seconds())
    parts = []
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts)
