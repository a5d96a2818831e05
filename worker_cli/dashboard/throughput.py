"""Throughput and lag over time, on the overview: per bucket of the last
hours (1 h by minute, 6 h by 5 minutes, 24 h by 20 minutes), the jobs
completed, failed for good or cancelled, and added, and the longest wait of
the completed jobs (from when they were due to when their last attempt
started), for every task or one (``?task=``), drawn as an inline SVG
(no script: the CSP stays ``default-src 'none'`` plus the dashboard's own
files; colours come from the stylesheet).

Where the figures come from, with no write beyond what the history already
costs (each index on the history would be paid by every completed job,
migrations/py/000011.sql, so none is added):

- completed: history rows (``_private_py_job_history``) of state
  ``succeeded``, by ``finished_at``; the wait: ``started_at - run_at`` (none
  for a job due since ``-infinity``, which ``add_job`` accepts);
- failed: history rows ``failed`` (archived by the cleanup, ``finished_at``
  being when the job failed) and live jobs failed for good (attempts used up,
  not locked), by ``updated_at``; cancelled: history rows ``cancelled``;
- retried: the attempt errors (``_private_py_job_errors``,
  migrations/py/000018.sql) of attempts after which the job was to run
  again, by ``failed_at`` (a Python pool writes one per failed attempt; a
  Node worker's are not recorded);
- added: ``created_at`` of live jobs and of history rows. A job a Node worker
  completed, or an admin function removed, leaves no row: it is not counted.

The range fits the data: when everything the chosen range holds lies
within a shorter one (a fresh queue, a burst a few minutes ago), the chart
shows that shorter range with its finer buckets and says so, rather than
squeezing the activity into the right edge of the longer one (its figures
are the same: nothing earlier was left out).

Bounds: one read-only statement reads the newest :data:`CHART_READ` history
rows by their primary key (``_private_py_job_history_pkey``, backward), the
newest :data:`CHART_READ` live jobs by theirs (``jobs_pkey1``, backward) and
the newest :data:`CHART_READ` attempt errors by theirs, and buckets those; the
task filter applies to the rows read (a rare task does not make the scan
longer). When a read reached its cap, the jobs below the lowest id read are
not seen: the chart says from when on its figures are complete (jobs added
before then and finished since are still missed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ..sql import dashboard as dashboard_sql
from .filters import JOB_STATES, WINDOW
from .inputs import BadInput, checked_text, shown

if TYPE_CHECKING:
    from starlette.datastructures import QueryParams

    from .page_data import Reader
    from .site import Site

__all__ = [
    "CHART_READ",
    "RANGES",
    "Chart",
    "ChartChoice",
    "chart_choice_of",
    "read_chart",
    "routes",
]

#: Hours shown -> seconds per bucket.
RANGES: dict[int, int] = {1: 60, 6: 300, 24: 1200}
DEFAULT_HOURS = 6
#: Rows read at most from the history, and from the jobs table (newest ids).
CHART_READ = 50_000

# The drawing, in SVG user units (the SVG scales to the panel's width).
WIDTH, HEIGHT, WAIT_HEIGHT = 960, 180, 70
LEFT, RIGHT, TOP, BOTTOM = 52, 8, 10, 22


@dataclass(frozen=True)
class ChartChoice:
    """What the chart shows: the last ``hours``, every task or one."""

    hours: int = DEFAULT_HOURS
    task: str | None = None

    @property
    def step(self) -> int:
        """Seconds per bucket."""
        return RANGES[self.hours]


def chart_choice_of(params: QueryParams) -> tuple[ChartChoice, list[str]]:
    """The chart's choice from the overview's query string (``hours``,
    ``task``), and what was wrong with it (each wrong value left out)."""
    problems = []
    hours = DEFAULT_HOURS
    text = params.get("hours") or ""
    if text:
        if text.isdigit() and int(text) in RANGES:
            hours = int(text)
        else:
            choices = ", ".join(str(one) for one in RANGES)
            problems.append(f"hours {shown(text)} is not one of {choices}; showing {hours}")
    task = None
    try:
        task = checked_text(params.get("task") or "", "task") or None
    except BadInput as exc:
        problems.append(f"{exc}; showing every task")
    return ChartChoice(hours, task), problems


@dataclass
class Bucket:
    start: datetime
    completed: int = 0
    failed: int = 0
    cancelled: int = 0
    added: int = 0
    retried: int = 0
    max_wait: float | None = None

    @property
    def finished(self) -> int:
        return self.completed + self.failed + self.cancelled


@dataclass
class Chart:
    """The chart's figures, and its drawing (SVG coordinates)."""

    choice: ChartChoice
    start: datetime
    buckets: list[Bucket]
    #: From when on the figures are complete (None: everything was read).
    complete_from: datetime | None
    #: The history holds no row at all (off, Node workers only, or pruned).
    history_empty: bool
    totals: dict[str, int] = field(default_factory=dict)
    #: The hours shown: the choice's, or a shorter range holding everything
    #: the choice's holds (see the module's docstring).
    hours: int = 0

    def __post_init__(self) -> None:
        self.hours = self.hours or self.choice.hours

    @property
    def fitted(self) -> bool:
        """A shorter range than chosen is shown (nothing earlier in the chosen one)."""
        return self.hours != self.choice.hours

    @property
    def step(self) -> int:
        return RANGES[self.hours]

    def first_active(self) -> int | None:
        """The index of the first bucket with anything in it (None: all empty)."""
        return next(
            (i for i, b in enumerate(self.buckets) if b.finished or b.added or b.retried), None
        )

    @property
    def longest_wait(self) -> float | None:
        waits = [b.max_wait for b in self.buckets if b.max_wait is not None]
        return max(waits) if waits else None

    # --- drawing ----------------------------------------------------------------

    width, height, wait_height = WIDTH, HEIGHT, WAIT_HEIGHT
    left, top = LEFT, TOP
    plot_height = HEIGHT - BOTTOM - TOP
    read = CHART_READ

    @property
    def plot_width(self) -> float:
        return WIDTH - LEFT - RIGHT

    @property
    def slot(self) -> float:
        return self.plot_width / len(self.buckets)

    @property
    def scale(self) -> int:
        """The top of the count axis: a round number above every bar and point."""
        return nice(max([1, *(max(b.finished, b.added, b.retried) for b in self.buckets)]))

    @property
    def wait_scale(self) -> float:
        return nice_seconds(self.longest_wait or 1.0)

    def x(self, index: int) -> float:
        return round(LEFT + index * self.slot, 2)

    def y(self, value: float) -> float:
        """The y of a count (the plot's bottom is HEIGHT - BOTTOM)."""
        return round(HEIGHT - BOTTOM - value / self.scale * (HEIGHT - BOTTOM - TOP), 2)

    def bar(self, value: float) -> float:
        return round(value / self.scale * (HEIGHT - BOTTOM - TOP), 2)

    def wait_bar(self, value: float | None) -> float:
        if not value:
            return 0.0
        return round(min(value / self.wait_scale, 1.0) * (WAIT_HEIGHT - TOP - 4), 2)

    @property
    def added_points(self) -> str:
        """The polyline of the jobs added."""
        return self._points([b.added for b in self.buckets])

    @property
    def retried_points(self) -> str:
        """The polyline of the attempts retried."""
        return self._points([b.retried for b in self.buckets])

    def _points(self, counts: list[int]) -> str:
        """A polyline through each bucket's middle at its count."""
        half = self.slot / 2
        return " ".join(f"{round(self.x(i) + half, 2)},{self.y(n)}" for i, n in enumerate(counts))

    @property
    def ticks(self) -> list[tuple[int, str]]:
        """Bucket indexes labelled on the time axis, with their labels (UTC)."""
        every = max(1, len(self.buckets) // 6)
        return [
            (i, b.start.astimezone(UTC).strftime("%H:%M"))
            for i, b in enumerate(self.buckets)
            if i % every == 0
        ]

    @property
    def partial_buckets(self) -> int:
        """How many buckets, from the left, lie before ``complete_from``."""
        if self.complete_from is None:
            return 0
        seconds = (self.complete_from - self.start).total_seconds()
        return max(0, min(len(self.buckets), math.ceil(seconds / self.step)))


def nice(value: float) -> int:
    """The smallest of 1, 2, 5 times a power of ten at or above ``value``."""
    power = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 5, 10):
        if factor * power >= value:
            return int(factor * power)
    return int(10 * power)  # pragma: no cover


def nice_seconds(value: float) -> float:
    """A round length of time at or above ``value`` seconds."""
    for step in (1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400):
        if step >= value:
            return float(step)
    return float(nice(value))


async def read_chart(reader: Reader, choice: ChartChoice, now: datetime) -> Chart:
    """The chart of ``choice`` ending with the bucket holding ``now``; or of
    the shortest range in :data:`RANGES` that holds all its activity."""
    chart = await _read_range(reader, choice, choice.hours, now)
    first = chart.first_active()
    if first is None:
        return chart
    # From the start of the first busy bucket to the chart's end: a shorter
    # range (ending at or before this end) that long holds every figure.
    span = (len(chart.buckets) - first) * chart.step
    shorter = [hours for hours in RANGES if hours < choice.hours and hours * 3600 >= span]
    if not shorter:
        return chart
    return await _read_range(reader, choice, min(shorter), now)


async def _read_range(reader: Reader, choice: ChartChoice, hours: int, now: datetime) -> Chart:
    """The chart of ``choice``'s task over the last ``hours``."""
    step = RANGES[hours]
    count = hours * 3600 // step
    epoch = now.timestamp()
    end = datetime.fromtimestamp((math.floor(epoch / step) + 1) * step, UTC)
    start = end - timedelta(seconds=step * count)
    buckets = [Bucket(start + timedelta(seconds=step * i)) for i in range(count)]
    found = await reader.rows(
        dashboard_sql.CHART_BUCKETS,
        read=CHART_READ,
        task=choice.task,
        start=start,
        end=end,
        step=step,
    )
    for row in found:
        if 0 <= row["bucket"] < count:
            bucket = buckets[row["bucket"]]
            bucket.completed, bucket.failed = row["completed"], row["failed"]
            bucket.cancelled, bucket.added = row["cancelled"], row["added"]
            bucket.retried = row["retried"]
            bucket.max_wait = row["max_wait"]
    cover = await reader.row(dashboard_sql.CHART_COVERAGE, read=CHART_READ)
    assert cover is not None
    complete_from = _complete_from(cover, start)
    chart = Chart(
        choice, start, buckets, complete_from, history_empty=not cover["history_read"], hours=hours
    )
    chart.totals = {
        kind: sum(getattr(b, kind) for b in buckets)
        for kind in ("completed", "failed", "cancelled", "added", "retried")
    }
    return chart


def _complete_from(cover: dict[str, Any], start: datetime) -> datetime | None:
    """From when on both reads saw every row (None: from the chart's start)."""
    bounds = [
        cover[f"{table}_from"]
        for table in ("history", "live", "errors")
        if cover[f"{table}_read"] >= CHART_READ and cover[f"{table}_from"] is not None
    ]
    latest = max(bounds, default=None)
    return latest if latest is not None and latest > start else None


def routes(dashboard: Site) -> list[Route]:
    """The overview with the chart (it takes the place of the plain one:
    register these routes before :func:`.pages.routes`)."""

    async def overview(request: Request) -> Response:
        choice, problems = chart_choice_of(request.query_params)
        async with dashboard.reading() as reader:
            data = await reader.overview()
            chart = await read_chart(reader, choice, data.now)
            tasks = await reader.task_identifiers()
        return dashboard.render(
            request,
            "overview.html",
            status=400 if problems else 200,
            refresh=True,
            title="Overview",
            page="overview",
            data=data,
            now=data.now,
            window=WINDOW,
            states=JOB_STATES,
            chart=chart,
            chart_tasks=tasks,
            chart_ranges=list(RANGES),
            chart_problems=problems,
        )

    return [Route("/", overview, name="overview")]
