"""Job counts that stay fast on a table of millions: exact when the table is
small, estimated from a bounded random sample of its pages when it is not.

Counting jobs by state needs every row: no index covers locked or failed
jobs. So the dashboard reads at most :data:`SAMPLE_PAGES` pages of
``_private_jobs`` (``TABLESAMPLE SYSTEM``: whole pages chosen at random) and
scales what it finds. A table of up to that many pages is read whole, and its
counts are exact; above, each count is an estimate and is shown as one
(``~2.3M``). A state the sample did not meet shows as ``~0``: rare states (a
few locked jobs among millions) may be missed, and the page says the counts
are sampled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

__all__ = ["SAMPLE_PAGES", "Census", "Count", "StateCounts", "sample_percent"]

#: Pages of ``_private_jobs`` the counts read at most (8 kB each: 16 MB).
SAMPLE_PAGES = 2_000


def sample_percent(pages: int) -> float:
    """The ``TABLESAMPLE SYSTEM`` percentage that reads about
    :data:`SAMPLE_PAGES` of ``pages``: 100 (every page, exact) up to that size."""
    if pages <= SAMPLE_PAGES:
        return 100.0
    return 100.0 * SAMPLE_PAGES / pages


@dataclass(frozen=True)
class Count:
    """A number of jobs, exact or estimated, as the page shows it."""

    value: float
    exact: bool = True
    #: True when the number is a lower bound (a capped count: ``50+``).
    at_least: bool = False

    def __str__(self) -> str:
        if self.exact:
            return f"{round(self.value):,}" + ("+" if self.at_least else "")
        return "~" + _approximate(self.value)

    def __bool__(self) -> bool:
        return self.value > 0

    @property
    def title(self) -> str:
        """What the number is, for a tooltip."""
        if self.exact:
            return "at least this many" if self.at_least else "exact"
        return f"estimated from a sample: about {round(self.value):,}"


def _approximate(value: float) -> str:
    """Two significant digits: ``2.3M``, ``45k``, ``450``, ``7``."""
    if value < 0.5:
        return "0"
    for limit, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= limit:
            scaled = value / limit
            return (f"{scaled:.1f}" if scaled < 10 else f"{scaled:.0f}") + suffix
    if value < 10:
        return f"{value:.0f}"
    return f"{round(value, -1 if value < 1000 else -2):.0f}"


@dataclass
class StateCounts:
    """Jobs by state (the words every command prints, as ``graphile-worker
    status`` counts them): every job is exactly one of waiting, scheduled,
    retrying, paused, running and failed."""

    total: float = 0
    waiting: float = 0
    scheduled: float = 0
    retrying: float = 0
    paused: float = 0
    running: float = 0
    failed: float = 0

    def add(self, state: str, jobs: float) -> None:
        self.total += jobs
        setattr(self, state, getattr(self, state) + jobs)


@dataclass
class Holder:
    """A worker pool holding locked jobs (as far as the sample saw)."""

    jobs: float = 0
    locked_since: datetime | None = None


@dataclass
class Census:
    """The counts of one sample. ``scale`` turns sampled rows into jobs."""

    percent: float
    jobs: StateCounts = field(default_factory=StateCounts)
    tasks: dict[str, StateCounts] = field(default_factory=dict)
    queues: dict[str, StateCounts] = field(default_factory=dict)
    holders: dict[str, Holder] = field(default_factory=dict)

    @property
    def exact(self) -> bool:
        return self.percent >= 100.0

    @property
    def scale(self) -> float:
        return 100.0 / self.percent

    def count(self, value: float) -> Count:
        """``value`` (already scaled) as shown."""
        return Count(value, self.exact)

    @classmethod
    def from_rows(cls, percent: float, rows: Iterable[dict[str, Any]]) -> Census:
        """Add up the sample's groups (``worker_cli.sql.dashboard.CENSUS``), scaled."""
        census = cls(percent)
        scale = census.scale
        for row in rows:
            jobs = float(row["jobs"]) * scale
            state = row["state"]
            census.jobs.add(state, jobs)
            task = row["task_identifier"] or "?"
            census.tasks.setdefault(task, StateCounts()).add(state, jobs)
            if row["queue_name"] is not None:
                census.queues.setdefault(row["queue_name"], StateCounts()).add(state, jobs)
            if row["locked_by"] is not None:
                holder = census.holders.setdefault(row["locked_by"], Holder())
                holder.jobs += jobs
                since = row["locked_since"]
                if since is not None and (
                    holder.locked_since is None or since < holder.locked_since
                ):
                    holder.locked_since = since
        census.tasks = dict(sorted(census.tasks.items()))
        census.queues = dict(sorted(census.queues.items()))
        return census
