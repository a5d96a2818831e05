"""The queue in Django's admin: jobs, finished jobs and schedules.

Registered on ``admin.site`` when ``django.contrib.admin`` is installed
(Django imports this module then: ``autodiscover``; :func:`register` puts
them on a site of your own); a project without the admin never imports it.
The pages read the models of :mod:`.models` and change nothing through them:
nothing can be added or edited, and every action goes through what the
command line runs (:mod:`.admin_actions`), in a transaction of Django's. A
job a worker holds is left alone and reported, as ``graphile-worker retry``
reports it.

Each action has its own permission (``graphile_worker.retry_job``,
``cancel_job``, ``reschedule_job``, ``fail_job``, ``delete_job``;
``pause_schedule``, ``resume_schedule``, ``remove_schedule``): a staff user
without it does not see the action. Viewing needs ``view_job``,
``view_finishedjob`` or ``view_schedule``. The lists are bounded on a table
of millions of jobs (:mod:`.admin_lists`). Payloads, results and errors are
shown as text, escaped (``format_html``), at most :data:`SHOWN` characters.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

import psycopg
from django import forms
from django.apps import apps
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import DatabaseError, transaction
from django.db.models import Q
from django.db.models.functions import Coalesce, Left
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from ...client.admin_batches import Outcome
from ...client.sync_worker_utils import SyncWorkerUtils
from ...db.backoff import one_line
from ...errors import GraphileWorkerError
from ...jobs.job_state import AttemptError
from .admin_actions import (
    CANCEL,
    DELETE,
    FAIL,
    RESCHEDULE,
    RETRY,
    JobAction,
    chosen_ids,
    queue_session,
    queue_utils,
    report,
    too_many,
)
from .admin_lists import (
    FinishedQueueFilter,
    FinishedStateFilter,
    FinishedTaskFilter,
    JobStateFilter,
    QueueAdmin,
    QueueFilter,
    TaskFilter,
)
from .models import DATABASE, FinishedJob, Job, Schedule, stored_text

__all__ = ["FinishedJobAdmin", "JobAdmin", "ScheduleAdmin", "register"]

logger = logging.getLogger("graphile_worker.django_admin")

#: The characters of a payload, a result or an error a page shows.
SHOWN = 100_000
#: The characters of an error a list reads (it shows the first line).
ERROR_HEAD = 200
#: The attempt errors a job's page shows (the newest).
ATTEMPTS_SHOWN = 50
#: The confirmation's field saying it was asked for from a job's own page.
FROM_PAGE = "from_page"

_ACTION_LOCATION = getattr(admin, "ActionLocation", None)


def register(site: admin.AdminSite) -> None:
    """Register the queue's pages on ``site`` (done for ``admin.site``)."""
    site.register(Job, JobAdmin)
    site.register(FinishedJob, FinishedJobAdmin)
    site.register(Schedule, ScheduleAdmin)


F = TypeVar("F", bound=Callable[..., Any])


def _display(**kwargs: Any) -> Callable[[F], F]:
    """``admin.display``, typed."""
    return cast(Callable[[F], F], admin.display(**kwargs))


def _action(**kwargs: Any) -> Callable[[F], F]:
    """``admin.action``, offered on the object's page too where Django can (6.1)."""
    if _ACTION_LOCATION is not None:
        kwargs["location"] = [_ACTION_LOCATION.CHANGE_LIST, _ACTION_LOCATION.CHANGE_FORM]
    return cast(Callable[[F], F], admin.action(**kwargs))


def _shown_text(text: str | None) -> str:
    """``text`` as a page shows it: at most :data:`SHOWN` characters, and no
    lone surrogate (a page is UTF-8)."""
    if text is None:
        return ""
    if len(text) > SHOWN:
        text = text[:SHOWN] + f"\n[... {len(text) - SHOWN:,} characters more ...]"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _pre(text: str | None, kind: str) -> str:
    """A block of text (escaped: ``format_html``), or a dash."""
    if text is None:
        return "-"
    return str(format_html('<pre class="graphile-worker-{}">{}</pre>', kind, _shown_text(text)))


def _json(text: str | None) -> str:
    """A ``json`` column's text, indented, escaped; as stored when Python
    cannot read it (said so)."""
    if text is None:
        return "-"
    try:
        shown = json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except (ValueError, RecursionError) as exc:
        why = f"Shown as stored: Python cannot read it as JSON ({type(exc).__name__})."
        return str(format_html("<p>{}</p>{}", why, _pre(text, "json")))
    return _pre(shown, "json")


def _first_line(text: str | None, width: int = 80) -> str:
    if not text or not text.strip():
        return ""
    line = text.strip().splitlines()[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def _attempt_errors(job_id: int) -> str:
    """A job's kept attempt errors (``get_job_errors``), newest first, each escaped."""
    try:  # a savepoint: a failure leaves the page's transaction usable
        with transaction.atomic(using=DATABASE), queue_utils() as utils:
            errors: list[AttemptError] = utils.get_job_errors(job_id)
    except (psycopg.Error, GraphileWorkerError, DatabaseError) as exc:
        return str(format_html("<p>could not read them: {}</p>", one_line(exc)))
    if not errors:
        return "-"
    newest = errors[::-1][:ATTEMPTS_SHOWN]
    shown = format_html_join(
        "",
        '<div class="graphile-worker-attempt"><p>{}</p>{}</div>',
        (
            (
                _attempt_title(error),
                "" if error.operator_retry else _pre(error.traceback or error.error, "error"),
            )
            for error in newest
        ),
    )
    if len(errors) > len(newest):
        more = format_html(
            "<p>{}</p>",
            f"... and {len(errors) - len(newest):,} older ones (graphile-worker job ID).",
        )
        return str(shown + more)
    return str(shown)


def _attempt_title(error: AttemptError) -> str:
    when = error.failed_at.isoformat(timespec="seconds")
    if error.operator_retry:
        return (
            f"{when}: retried by an operator ({error.retried_by}) after {error.attempt} "
            "attempts: the attempts above are numbered from 1 again"
        )
    attempt = f"attempt {error.attempt}" if error.attempt is not None else "an attempt"
    pool = f" on {error.pool_id}" if error.pool_id else ""
    return f"{when}: {attempt} failed{pool}" + ("" if error.retried else " (not retried)")


# --- jobs -------------------------------------------------------------------------


class _AttemptFields:
    """What the jobs' and the finished jobs' pages show alike."""

    @_display(description="attempts")
    def attempts_shown(self, job: Job | FinishedJob) -> str:
        return f"{job.attempts}/{job.max_attempts}"

    @_display(description="last error")
    def last_error_shown(self, job: Job | FinishedJob) -> str:
        return _pre(job.last_error, "error")

    @_display(description="run at")
    def run_at_shown(self, job: Job | FinishedJob) -> datetime | str:
        """``run_at``; as stored (``infinity``, ``-infinity``, a year past
        9999) where a Python datetime cannot hold it (see
        :class:`~.models.StoredTimestamp`)."""
        return job.run_at if job.run_at is not None else str(job.run_at_stored)


class JobAdmin(_AttemptFields, QueueAdmin):
    """The jobs in the queue (waiting, scheduled, retrying, paused, running,
    failed), newest first, with the actions of ``graphile-worker retry``,
    ``cancel``, ``reschedule``, ``fail`` and ``remove``."""

    list_display = (
        "id",
        "task",
        "job_queue",
        "state_shown",
        "attempts_shown",
        "run_at_shown",
        "error_shown",
    )
    list_display_links = ("id",)
    list_select_related = ("task", "job_queue")
    list_filter = (JobStateFilter, TaskFilter, QueueFilter)
    sortable_by = ("id",)
    search_fields = ("=id",)
    search_help_text = "A job's id, or its key."
    json_columns = ("payload",)
    actions = ("retry_jobs", "cancel_jobs", "reschedule_jobs", "fail_jobs", "delete_jobs")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("state_shown", "attempts_shown", "priority"),
                    ("task", "job_queue", "key"),
                    ("run_at_shown", "created_at", "updated_at"),
                    ("locked_by", "locked_at"),
                )
            },
        ),
        ("Payload", {"fields": ("payload_shown",)}),
        ("Errors", {"fields": ("last_error_shown", "attempt_errors_shown")}),
    )
    readonly_fields = (
        "state_shown",
        "attempts_shown",
        "run_at_shown",
        "payload_shown",
        "last_error_shown",
        "attempt_errors_shown",
    )

    def get_queryset(self, request: HttpRequest) -> Any:
        return (
            super()
            .get_queryset(request)
            .with_state()
            .select_related("task", "job_queue")
            .annotate(run_at_stored=stored_text("run_at"))
        )

    def list_columns(self, queryset: Any) -> Any:
        return queryset.defer("last_error", "flags").annotate(
            error_head=Left("last_error", ERROR_HEAD)
        )

    def get_search_results(
        self, request: HttpRequest, queryset: Any, search_term: str
    ) -> tuple[Any, bool]:
        """A job's id or its key (jobs_pkey1, jobs_key_key1)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        if term.isdigit() and len(term) <= 18:
            return queryset.filter(Q(pk=int(term)) | Q(key=term)), False
        return queryset.filter(key=term), False

    # --- columns and fields

    @_display(description="state")
    def state_shown(self, job: Any) -> str:
        """The state, and for a paused job the pause holding it: ``paused (queue mail)``."""
        state = getattr(job, "state", None) or "-"
        paused_by = getattr(job, "paused_by", None)
        return f"{state} ({paused_by})" if state == "paused" and paused_by else str(state)

    @_display(description="last error")
    def error_shown(self, job: Job) -> str:
        return _first_line(getattr(job, "error_head", None))

    @_display(description="payload")
    def payload_shown(self, job: Job) -> str:
        return _json(getattr(job, "payload_text", None))

    @_display(description="attempts' errors")
    def attempt_errors_shown(self, job: Job) -> str:
        return _attempt_errors(int(job.id))

    # --- permissions

    def has_retry_job_permission(self, request: HttpRequest) -> bool:
        return self._permission(request, "retry_job")

    def has_cancel_job_permission(self, request: HttpRequest) -> bool:
        return self._permission(request, "cancel_job")

    def has_reschedule_job_permission(self, request: HttpRequest) -> bool:
        return self._permission(request, "reschedule_job")

    def has_fail_job_permission(self, request: HttpRequest) -> bool:
        return self._permission(request, "fail_job")

    def has_delete_job_permission(self, request: HttpRequest) -> bool:
        return self._permission(request, "delete_job")

    # --- actions

    @_action(permissions=["retry_job"], description="Retry (run now, attempts again)")
    def retry_jobs(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        return self._act(request, queryset, RETRY, "retry_jobs")

    @_action(permissions=["cancel_job"], description="Cancel")
    def cancel_jobs(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        return self._act(request, queryset, CANCEL, "cancel_jobs")

    @_action(permissions=["reschedule_job"], description="Reschedule")
    def reschedule_jobs(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        return self._act(request, queryset, RESCHEDULE, "reschedule_jobs")

    @_action(permissions=["fail_job"], description="Permanently fail")
    def fail_jobs(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        return self._act(request, queryset, FAIL, "fail_jobs")

    @_action(permissions=["delete_job"], description="Delete")
    def delete_jobs(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        return self._act(request, queryset, DELETE, "delete_jobs")

    def _act(
        self, request: HttpRequest, queryset: Any, action: JobAction, name: str
    ) -> HttpResponse | None:
        """The action on the chosen jobs: asked first (its page) when it has
        a form, then done through the command line's statement; what it did
        is said as ``graphile-worker`` says it."""
        ids = chosen_ids(request, queryset)
        if ids is None:
            self.message_user(request, too_many("jobs"), messages.ERROR)
            return None
        if not ids:
            self.message_user(request, "No job was chosen: nothing was changed.", messages.WARNING)
            return None
        data: dict[str, Any] = {}
        if action.form is not None:
            form = action.form(request.POST if request.POST.get("post") == "yes" else None)
            if not form.is_bound or not form.is_valid():
                return self._confirm(request, action, name, ids, form)
            data = form.cleaned_data
        outcome = Outcome(action.name)
        try:
            with transaction.atomic(using=DATABASE), queue_session() as session:
                session.act(outcome, session.action(action.name), ids, **action.params(data))
        except (psycopg.Error, GraphileWorkerError, DatabaseError) as exc:
            self.message_user(request, f"Nothing was changed: {one_line(exc)}", messages.ERROR)
            return None
        logger.info(
            "Django admin: %s by %s: %d changed, %d locked, %d unchanged, %d missing",
            action.name,
            request.user.get_username(),
            len(outcome.changed),
            len(outcome.locked),
            len(outcome.unchanged),
            len(outcome.missing),
        )
        for level, line in report(outcome, action):
            self.message_user(request, line, level)
        return self._back(request, ids)

    def _confirm(
        self,
        request: HttpRequest,
        action: JobAction,
        name: str,
        ids: Sequence[int],
        form: forms.Form,
    ) -> HttpResponse:
        """The page asking to confirm ``action`` (the admin's action ``name``)
        on ``ids``, and for its form's fields. It posts back to the list
        (with its filters), or for a job's own page, to the list and then
        back to the job's page."""
        shown = [
            f"job {job.id}: {job.task.identifier}, {self.state_shown(job)}"
            for job in Job.objects.with_state()
            .select_related("task")
            .defer("payload", "last_error", "flags")
            .filter(pk__in=ids[:20])
        ]
        running = Job.objects.filter(pk__in=ids, locked_at__isnull=False).count()
        from_page = request.POST.get(FROM_PAGE) == "1" or "/change/" in request.path
        changelist = reverse(f"{self.admin_site.name}:graphile_worker_job_changelist")
        form_url = changelist if from_page else changelist + _query(request)
        context = {
            **self.admin_site.each_context(request),
            "title": f"{action.label}: {len(ids):,} job{'' if len(ids) == 1 else 's'}",
            "opts": self.opts,
            "noun": "job",
            "action": action,
            "action_name": name,
            "form": form,
            "count": len(ids),
            "shown": shown,
            "more": len(ids) - len(shown),
            "running": running,
            "selected": ids if from_page else request.POST.getlist(ACTION_CHECKBOX_NAME),
            "select_across": request.POST.get("select_across") == "1" and not from_page,
            "upto": max(ids),
            "from_page": from_page,
            "form_url": form_url,
            "cancel_url": (
                reverse(f"{self.admin_site.name}:graphile_worker_job_change", args=[ids[0]])
                if from_page and len(ids) == 1
                else form_url
            ),
        }
        return TemplateResponse(request, "admin/graphile_worker/confirm_action.html", context)

    def _back(self, request: HttpRequest, ids: Sequence[int]) -> HttpResponse | None:
        """From a job's page, back to it (or to its finished page); else None:
        Django goes back to the list."""
        if request.POST.get(FROM_PAGE) != "1" or len(ids) != 1:
            return None
        [job_id] = ids
        name = self.admin_site.name
        if Job.objects.filter(pk=job_id).exists():
            return HttpResponseRedirect(
                reverse(f"{name}:graphile_worker_job_change", args=[job_id])
            )
        if request.user.has_perm(f"{self.opts.app_label}.view_finishedjob") and (
            FinishedJob.objects.filter(pk=job_id).exists()
        ):
            return HttpResponseRedirect(
                reverse(f"{name}:graphile_worker_finishedjob_change", args=[job_id])
            )
        return HttpResponseRedirect(reverse(f"{name}:graphile_worker_job_changelist"))


def _query(request: HttpRequest) -> str:
    """The list's query string (its filters), for the confirmation to post back to."""
    query = request.META.get("QUERY_STRING", "")
    return f"?{query}" if query else ""


# --- finished jobs ----------------------------------------------------------------


class FinishedJobAdmin(_AttemptFields, QueueAdmin):
    """The finished jobs Python workers recorded (succeeded, failed,
    cancelled, removed), newest first, until they expire. Read only."""

    list_display = (
        "job_id",
        "task_identifier",
        "queue_name",
        "state",
        "attempts_shown",
        "finished_at",
        "outcome_shown",
    )
    list_display_links = ("job_id",)
    list_filter = (FinishedStateFilter, FinishedTaskFilter, FinishedQueueFilter)
    sortable_by = ("job_id",)
    search_fields = ("=job_id",)
    search_help_text = "A job's id, or its key (among the newest 10,000)."
    json_columns = ("result",)
    actions = None
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("state", "attempts_shown", "priority"),
                    ("task_identifier", "queue_name", "key"),
                    ("created_at", "run_at_shown", "started_at", "finished_at"),
                    ("pool_id", "timed_out"),
                    ("cancel_requested_at", "cancel_reason"),
                    ("removed_by", "expires_at"),
                )
            },
        ),
        ("Result", {"fields": ("result_shown", "result_error")}),
        ("Errors", {"fields": ("last_error_shown", "attempt_errors_shown")}),
    )
    readonly_fields = (
        "attempts_shown",
        "run_at_shown",
        "result_shown",
        "last_error_shown",
        "attempt_errors_shown",
    )

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).annotate(run_at_stored=stored_text("run_at"))

    def indexed_search(self, term: str) -> bool:
        return term.isdigit() and len(term) <= 18

    def list_columns(self, queryset: Any) -> Any:
        return queryset.defer("last_error", "cancel_reason", "flags").annotate(
            error_head=Left(Coalesce("cancel_reason", "last_error"), ERROR_HEAD)
        )

    def get_search_results(
        self, request: HttpRequest, queryset: Any, search_term: str
    ) -> tuple[Any, bool]:
        """A job's id (the history's primary key), or its key (no index: in the window)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        if self.indexed_search(term):
            return queryset.filter(pk=int(term)), False
        return queryset.filter(key=term), False

    @_display(description="error or reason")
    def outcome_shown(self, job: FinishedJob) -> str:
        """A cancel's reason, or the last error (none for a success: an
        earlier attempt's error would mislead)."""
        if job.state == "succeeded":
            return ""
        return _first_line(getattr(job, "error_head", None))

    @_display(description="result")
    def result_shown(self, job: FinishedJob) -> str:
        return _json(getattr(job, "result_text", None))

    @_display(description="attempts' errors")
    def attempt_errors_shown(self, job: FinishedJob) -> str:
        return _attempt_errors(int(job.job_id))


# --- schedules --------------------------------------------------------------------


class ScheduleAdmin(QueueAdmin):
    """The schedules in the database, by identifier, with the actions of
    ``graphile-worker schedule pause``, ``resume`` and ``remove``."""

    list_display = (
        "identifier",
        "pattern",
        "tz",
        "task_identifier",
        "queue_name",
        "paused",
        "last_execution",
        "last_run_at",
    )
    list_display_links = ("identifier",)
    list_filter = ("paused",)
    sortable_by = ("identifier",)
    search_fields = ("=identifier",)
    search_help_text = "A schedule's identifier."
    json_columns = ("payload",)
    windowed = False
    actions = ("pause_schedules", "resume_schedules", "remove_schedules")
    fieldsets = (
        (
            None,
            {
                "fields": (
                    ("pattern", "tz", "fill", "paused"),
                    ("task_identifier", "queue_name", "priority", "max_attempts", "job_key"),
                    ("last_execution", "last_run_at", "known_since"),
                    ("created_at", "updated_at", "version"),
                )
            },
        ),
        ("Payload", {"fields": ("payload_shown",)}),
    )
    readonly_fields = ("payload_shown",)

    def get_search_results(
        self, request: HttpRequest, queryset: Any, search_term: str
    ) -> tuple[Any, bool]:
        term = search_term.strip()
        return (queryset.filter(pk=term) if term else queryset), False

    @_display(description="payload")
    def payload_shown(self, schedule: Schedule) -> str:
        return _json(getattr(schedule, "payload_text", None))

    def has_pause_schedule_permission(self, request: HttpRequest) -> bool:
        return self._permission(request, "pause_schedule")

    def has_resume_schedule_permission(self, request: HttpRequest) -> bool:
        return self._permission(request, "resume_schedule")

    def has_remove_schedule_permission(self, request: HttpRequest) -> bool:
        return self._permission(request, "remove_schedule")

    @_action(permissions=["pause_schedule"], description="Pause")
    def pause_schedules(self, request: HttpRequest, queryset: Any) -> None:
        self._each(request, queryset, "Paused", lambda utils, name: utils.pause_schedule(name))

    @_action(permissions=["resume_schedule"], description="Resume")
    def resume_schedules(self, request: HttpRequest, queryset: Any) -> None:
        self._each(request, queryset, "Resumed", lambda utils, name: utils.resume_schedule(name))

    @_action(permissions=["remove_schedule"], description="Remove")
    def remove_schedules(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        if request.POST.get("post") != "yes":
            return self._confirm_removal(request, queryset)
        self._each(request, queryset, "Removed", lambda utils, name: utils.remove_schedule(name))
        return None

    def _confirm_removal(self, request: HttpRequest, queryset: Any) -> HttpResponse | None:
        """The page asking to confirm the removal of the chosen schedules
        (as Django asks before a delete); it posts their names back."""
        names = chosen_ids(request, queryset)
        if names is None:
            self.message_user(request, too_many("schedules"), messages.ERROR)
            return None
        shown = [
            f"{s.identifier}: {s.task_identifier}, {s.pattern}"
            for s in Schedule.objects.filter(pk__in=names[:20]).order_by("pk")
        ]
        form_url = reverse(f"{self.admin_site.name}:graphile_worker_schedule_changelist")
        form_url += _query(request)
        count = len(names)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Remove: {count:,} schedule{'' if count == 1 else 's'}",
            "opts": self.opts,
            "noun": "schedule",
            "action": {"label": "Remove"},
            "action_name": "remove_schedules",
            "form": None,
            "count": count,
            "shown": shown,
            "more": count - len(shown),
            "selected": names,
            "form_url": form_url,
            "cancel_url": form_url,
        }
        return TemplateResponse(request, "admin/graphile_worker/confirm_action.html", context)

    def _each(
        self,
        request: HttpRequest,
        queryset: Any,
        done: str,
        act: Callable[[SyncWorkerUtils, str], object],
    ) -> None:
        """``act`` on each chosen schedule through the utilities; what it did."""
        names = chosen_ids(request, queryset)
        if names is None:
            self.message_user(request, too_many("schedules"), messages.ERROR)
            return
        changed: list[str] = []
        missing: list[str] = []
        try:
            with transaction.atomic(using=DATABASE), queue_utils() as utils:
                for name in names:
                    (changed if act(utils, name) else missing).append(name)
        except (psycopg.Error, GraphileWorkerError, DatabaseError) as exc:
            self.message_user(request, f"Nothing was changed: {one_line(exc)}", messages.ERROR)
            return
        logger.info(
            "Django admin: %s schedules by %s: %s",
            done.lower(),
            request.user.get_username(),
            ", ".join(changed),
        )
        noun = "schedule" if len(changed) == 1 else "schedules"
        self.message_user(
            request,
            f"{done} {len(changed):,} {noun}" + (f": {', '.join(changed)}" if changed else ""),
            messages.SUCCESS if changed else messages.WARNING,
        )
        if missing:
            self.message_user(request, f"Not found: {', '.join(missing)}", messages.WARNING)


if apps.is_installed("django.contrib.admin"):
    register(admin.site)
