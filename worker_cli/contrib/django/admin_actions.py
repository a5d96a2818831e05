"""What the admin's actions run and say (:mod:`.admin`): the command line's.

An action on jobs is one of ``graphile-worker``'s (:class:`JobAction`:
retry, reschedule, fail, remove, cancel), run through the same statements
(:class:`worker_cli.client.admin_batches.SyncSession`, graphile-worker's
admin functions, in batches of 1,000 ids) on Django's connection to the
queue's database (:func:`queue_session`), so in a transaction of Django's;
what it did is said as the command line prints it (:func:`report`): a job a
worker holds is skipped, left alone and reported. The schedules' actions go
through :class:`~worker_cli.client.sync_worker_utils.SyncWorkerUtils`
(:func:`queue_utils`). An action acts on at most :data:`MOST_ACTED` jobs.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django import forms
from django.contrib import messages
from django.db import connections
from django.http import HttpRequest
from django.utils import timezone

from ...cli.admin_jobs import format_outcome
from ...client.admin_batches import Outcome, SyncSession
from ...client.sync_worker_utils import SyncWorkerUtils, make_sync_worker_utils
from ...errors import JobSpecError
from ...jobs.last_error import storable
from ...jobs.text_args import check_text
from .models import DATABASE, SCHEMA

__all__ = [
    "BY",
    "CANCEL",
    "DELETE",
    "FAIL",
    "MOST_ACTED",
    "RESCHEDULE",
    "RETRY",
    "JobAction",
    "ReasonForm",
    "RescheduleForm",
    "chosen_ids",
    "queue_session",
    "queue_utils",
    "report",
    "too_many",
]

#: The most jobs (or schedules) one action acts on.
MOST_ACTED = 10_000
#: Who acts, as the history's ``removed_by`` and a retry's mark keep it.
BY = "django-admin"
#: ``fail``'s reason when none is given.
DEFAULT_FAIL_REASON = "permanently failed from the Django admin"


@contextmanager
def queue_utils() -> Iterator[SyncWorkerUtils]:
    """The sync utilities on Django's connection to the queue's database (its
    transaction joined; the caller's ``atomic`` decides when it commits)."""
    connection = connections[DATABASE]
    connection.ensure_connection()
    with make_sync_worker_utils(connection=connection.connection, schema=SCHEMA) as utils:
        yield utils


@contextmanager
def queue_session() -> Iterator[SyncSession]:
    """The command line's admin statements on Django's connection (as :func:`queue_utils`)."""
    with queue_utils() as utils, utils.connection() as conn:
        yield SyncSession(conn, SCHEMA, by=BY)


class RescheduleForm(forms.Form):  # type: ignore[misc]
    """Reschedule's question: the new ``run_at`` (in the site's time zone)."""

    run_at = forms.DateTimeField(
        label="Run at", widget=forms.DateTimeInput(attrs={"type": "datetime-local"})
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        zone = timezone.get_current_timezone_name()
        self.fields["run_at"].help_text = f"In {zone}, the site's time zone."


class ReasonForm(forms.Form):  # type: ignore[misc]
    """Cancel's and Permanently fail's question: why (optional; text
    PostgreSQL can store)."""

    reason = forms.CharField(label="Reason", required=False, max_length=1000, strip=True)

    def clean_reason(self) -> str:
        reason: str = self.cleaned_data["reason"]
        try:
            check_text(reason, "reason")
        except JobSpecError as exc:
            raise forms.ValidationError(exc.reason) from None
        return reason


@dataclass(frozen=True)
class JobAction:
    """An action on jobs: the command line's (``retry``, ``reschedule``,
    ``fail``, ``remove``, ``cancel``), how it is said, and what it asks first."""

    #: The command line's action (:data:`worker_cli.sql.admin.ACTIONS`).
    name: str
    #: The action as a button says it.
    label: str
    #: What was done (``Retried``), and why a job was left as it was.
    done: str
    unchanged: str
    #: Asked for on a page before it is done (None: done at once).
    form: type[forms.Form] | None = None
    #: What becomes of the running jobs among those chosen.
    running: str = "they are left alone"

    def params(self, data: dict[str, Any]) -> dict[str, Any]:
        """The action statement's parameters from the form's data."""
        if self.name == "reschedule":
            return {
                "run_at": data["run_at"],
                "delay": None,
                "priority": None,
                "attempts": None,
                "max_attempts": None,
            }
        if self.name == "fail":
            return {"reason": storable(data.get("reason") or DEFAULT_FAIL_REASON)}
        if self.name == "cancel":
            return {"reason": data.get("reason") or None}
        return {}


RETRY = JobAction("retry", "Retry", "Retried", "unchanged meanwhile")
RESCHEDULE = JobAction(
    "reschedule", "Reschedule", "Rescheduled", "unchanged meanwhile", RescheduleForm
)
FAIL = JobAction(
    "fail", "Permanently fail", "Permanently failed", "already permanently failed", ReasonForm
)
DELETE = JobAction("remove", "Delete", "Deleted", "gone meanwhile", forms.Form)
CANCEL = JobAction(
    "cancel",
    "Cancel",
    "Cancelled",
    "finished already",
    ReasonForm,
    running="they are told to stop (recorded as cancelled when they end)",
)


def chosen_ids(request: HttpRequest, queryset: Any) -> list[Any] | None:
    """The ids an action acts on, in order, up to the ``upto`` its
    confirmation carries; None when there are more than :data:`MOST_ACTED`."""
    upto = request.POST.get("upto")
    if upto and upto.isdigit():
        queryset = queryset.filter(pk__lte=int(upto))
    ids = list(queryset.order_by("pk").values_list("pk", flat=True)[: MOST_ACTED + 1])
    return None if len(ids) > MOST_ACTED else ids


def too_many(noun: str) -> str:
    """The line refusing an action on more than :data:`MOST_ACTED` ``noun``."""
    return (
        f"More than {MOST_ACTED:,} {noun} are selected, and an action acts on at most "
        f"{MOST_ACTED:,}: nothing was changed. Narrow the list with a filter, or use the "
        "command line (graphile-worker retry, fail, remove, cancel --task ...)."
    )


def report(outcome: Outcome, action: JobAction) -> list[tuple[int, str]]:
    """What the action did, as ``graphile-worker`` prints it, a level each
    line: what was done, then each kind of job left alone (a warning)."""
    lines = format_outcome(outcome, action.done, action.unchanged)
    levels = [messages.SUCCESS if outcome.changed else messages.WARNING]
    levels += [messages.WARNING] * sum(
        1 for ids in (outcome.locked, outcome.unchanged, outcome.missing) if ids
    )
    if outcome.stopped:
        levels.append(messages.INFO)
    return list(zip(levels, lines, strict=True))
