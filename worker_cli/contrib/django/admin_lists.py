"""The queue's pages in Django's admin, bounded on a table of millions of
jobs: what :mod:`.admin`'s pages share (:class:`QueueAdmin`: read only, the
queue's database, a missing schema said in one line) and how their lists
stay bounded.

A list is read through the primary key only (newest first, or oldest: no
other order), so a page is an index range. Its count stops at
:data:`COUNT_CAP` (a ``count(*)`` over a LIMITed subquery; one row more is
shown ``10,000+``). Its filters (state, task, queue; nothing else is taken
from the query string, never a lookup of any column) and a search that no
index serves look at a window of :data:`WINDOW` rows: the newest, or those
below ``?before=ID``; the page says so and links to the window before. The
indexes of ``_private_jobs`` are Node's (migrations/base.sql: ``jobs_pkey1``,
``jobs_key_key1``); the history has its primary key only
(migrations/py/000011.sql).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any, cast

from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import DatabaseError, transaction
from django.db.models import TextField
from django.db.models.functions import Cast
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import SimpleTemplateResponse
from django.urls import reverse

from ...jobs.job_state import STATE_ALIASES
from ...sql.admin import LIVE_STATES
from .backend import not_installed, schema_missing
from .models import DATABASE, SCHEMA, JobQueue, JobTask

__all__ = [
    "COUNT_CAP",
    "FINISHED_STATES",
    "WINDOW",
    "BoundedPaginator",
    "FinishedQueueFilter",
    "FinishedStateFilter",
    "FinishedTaskFilter",
    "JobStateFilter",
    "QueueAdmin",
    "QueueChangeList",
    "QueueFilter",
    "TaskFilter",
    "Window",
]

#: Rows a filter (or a search no index serves) looks at: a window of the
#: newest ids (the dashboard's window too).
WINDOW = 10_000
#: A list's count stops here (one more row found: shown ``10,000+``).
COUNT_CAP = 10_000
#: The task identifiers and queue names a filter offers (the first by name).
CHOICES = 100
#: The query parameter of a window's end (its rows are below this id).
BEFORE_VAR = "before"
#: The finished jobs' states (the history's: migrations/py/000023.sql).
FINISHED_STATES = ("succeeded", "failed", "cancelled", "removed")


class BoundedPaginator(Paginator):  # type: ignore[misc]
    """Django's paginator, counting at most :data:`COUNT_CAP` + 1 rows (a
    ``count(*)`` over a LIMITed subquery, never over the whole table)."""

    @cached_property
    def count(self) -> int:
        return int(self.object_list.values("pk")[: COUNT_CAP + 1].count())


@dataclass(frozen=True)
class Window:
    """The rows a filter looked at: ids from ``lowest`` (None: the first)
    up to below ``before`` (None: the newest); ``older``: rows lie below it."""

    lowest: int | None
    before: int | None
    older: bool


class QueueChangeList(ChangeList):  # type: ignore[misc]
    """A list read through the primary key only: ordered by it (either
    way), counted up to :data:`COUNT_CAP`, filtered inside a window of
    :data:`WINDOW` rows (``?before=ID`` moves it back)."""

    window: Window | None = None
    #: How many rows a window holds, as the page says it.
    window_size = f"{WINDOW:,}"

    def get_filters_params(self, params: Any = None) -> Any:
        lookup = super().get_filters_params(params)
        values = lookup.pop(BEFORE_VAR, None)
        self.before = _before(values[-1] if values else None)
        return lookup

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> Any:
        admin_: QueueAdmin = self.model_admin
        queryset = admin_.list_columns(super().get_queryset(request, exclude_parameters))
        indexed = not self.query or admin_.indexed_search(self.query.strip())
        self.window = None
        if admin_.windowed and (self.has_active_filters or self.before or not indexed):
            self.window = self._window()
            if self.window.before is not None:
                queryset = queryset.filter(pk__lt=self.window.before)
            if self.window.lowest is not None:
                queryset = queryset.filter(pk__gte=self.window.lowest)
        return queryset

    def _window(self) -> Window:
        """The newest :data:`WINDOW` ids below ``before``: where they start
        (the primary key, read backward), and whether any lies below."""
        below = self.root_queryset.model.objects.all()
        if self.before is not None:
            below = below.filter(pk__lt=self.before)
        ids = list(below.order_by("-pk").values_list("pk", flat=True)[WINDOW - 1 : WINDOW + 1])
        return Window(ids[0] if ids else None, self.before, len(ids) > 1)

    def get_ordering(self, request: HttpRequest, queryset: Any) -> list[Any]:
        """The primary key's order (as asked, or the model's): no other
        order has an index on these tables."""
        pk = self.model._meta.pk.name
        for field in super().get_ordering(request, queryset):
            if isinstance(field, str) and field.lstrip("-") in ("pk", pk):
                return [field]
        return list(self.model._meta.ordering)

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        #: The count reached the cap: more rows than it says.
        self.count_capped = self.result_count > COUNT_CAP
        #: The count as shown: ``10,000+`` when capped.
        self.count_shown = f"{COUNT_CAP:,}+" if self.count_capped else f"{self.result_count:,}"
        if not (self.has_active_filters or self.query):
            # No "N results (Show all)" beside the search box for the plain list.
            self.full_result_count = self.result_count

    def older_url(self) -> str | None:
        """The same filters on the window before this one (None: no rows there)."""
        if self.window is None or not self.window.older or self.window.lowest is None:
            return None
        return str(self.get_query_string({BEFORE_VAR: self.window.lowest}, remove=["p"]))

    def newest_url(self) -> str | None:
        """The same filters on the newest window (None: this is it)."""
        if self.window is None or self.window.before is None:
            return None
        return str(self.get_query_string(remove=[BEFORE_VAR, "p"]))


def _before(value: str | None) -> int | None:
    if value is None or value == "":
        return None
    if not value.isdigit() or len(value) > 19:
        raise IncorrectLookupParameters(f"{BEFORE_VAR} must be a job id")
    return int(value)


class QueueAdmin(admin.ModelAdmin):  # type: ignore[misc]
    """What the queue's pages share: read only, bounded lists (see the
    module's docstring), the queue's database."""

    paginator = BoundedPaginator
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    list_per_page = 50
    #: Whether filters look at a window of the newest rows (the primary key
    #: is an id that grows).
    windowed = True
    #: The ``json`` columns the object's page shows. They are never read as
    #: parsed values (PostgreSQL stores JSON that Python cannot read: nested
    #: 5,000 deep, a 5,000-digit number) but as their text
    #: (``<column>_text``), parsed where they are shown.
    json_columns: tuple[str, ...] = ()

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).defer(*self.json_columns)

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        """The object of a page, with its ``json`` columns as text."""
        texts = {f"{name}_text": Cast(name, TextField()) for name in self.json_columns}
        queryset = self.get_queryset(request).annotate(**texts)
        field = self.opts.pk if from_field is None else self.opts.get_field(from_field)
        try:
            return queryset.get(**{field.name: field.to_python(object_id)})
        except (self.model.DoesNotExist, ValidationError, ValueError):
            return None

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return QueueChangeList

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        view = super().changelist_view
        return self._installed(request, lambda: view(request, extra_context))

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: Any = None,
    ) -> HttpResponse:
        view = super().changeform_view
        return self._installed(request, lambda: view(request, object_id, form_url, extra_context))

    def _installed(self, request: HttpRequest, view: Callable[[], HttpResponse]) -> HttpResponse:
        """The page (rendered here, in a savepoint), or, when the queue's
        schema is missing, the admin's index saying so in one line."""
        try:
            with transaction.atomic(using=DATABASE):
                response = view()
                if isinstance(response, SimpleTemplateResponse) and not response.is_rendered:
                    response.render()
                return response
        except DatabaseError as exc:
            if not schema_missing(exc):
                raise
        self.message_user(request, not_installed(SCHEMA, DATABASE), messages.ERROR)
        return HttpResponseRedirect(reverse(f"{self.admin_site.name}:index"))

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def lookup_allowed(self, lookup: str, value: Any, request: HttpRequest | None = None) -> bool:
        """Only the list's own filters: a lookup of any column (``?last_error__contains=``)
        would scan the whole table."""
        allowed: set[str] = set()
        for spec in self.list_filter:
            if isinstance(spec, type) and issubclass(spec, admin.SimpleListFilter):
                allowed.add(cast(Any, spec).parameter_name)
            elif isinstance(spec, str):
                allowed.update({f"{spec}__exact", f"{spec}__isnull"})
        return lookup in allowed

    def indexed_search(self, term: str) -> bool:
        """Whether an index finds what ``term`` searches (else the window is read)."""
        return True

    def list_columns(self, queryset: Any) -> Any:
        """The list's rows: what the columns show, without the long values
        (a payload, a result) that only the object's page shows."""
        return queryset

    def _permission(self, request: HttpRequest, codename: str) -> bool:
        return bool(request.user.has_perm(f"{self.opts.app_label}.{codename}"))


# --- list filters -----------------------------------------------------------------


class _ChoiceFilter(admin.SimpleListFilter):  # type: ignore[misc]
    """A filter whose value is one of a few words, or one name of a bounded list."""

    def value_checked(self) -> str | None:
        value = self.value()
        if value is not None and "\x00" in value:
            raise IncorrectLookupParameters(f"{self.parameter_name} holds a NUL character")
        return value


class JobStateFilter(_ChoiceFilter):
    """A live job's state (``py_job_state``'s words)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state, state) for state in LIVE_STATES]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value_checked()
        if value is None:
            return queryset
        state = STATE_ALIASES.get(value, value)  # an earlier version's word
        if state not in LIVE_STATES:
            raise IncorrectLookupParameters(f"unknown state {value!r}")
        return queryset.filter(state=state)


class FinishedStateFilter(_ChoiceFilter):
    """A finished job's state (the history's words)."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(state, state) for state in FINISHED_STATES]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value_checked()
        if value is None:
            return queryset
        if value not in FINISHED_STATES:
            raise IncorrectLookupParameters(f"unknown state {value!r}")
        return queryset.filter(state=value)


class TaskFilter(_ChoiceFilter):
    """A task identifier: the first :data:`CHOICES` by name are offered, any works."""

    title = "task"
    parameter_name = "task"
    #: The lookup filtering by the identifier.
    lookup = "task__identifier"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = JobTask.objects.order_by("identifier").values_list("identifier", flat=True)
        return [(name, name) for name in names[:CHOICES]]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value_checked()
        return queryset if value is None else queryset.filter(**{self.lookup: value})


class FinishedTaskFilter(TaskFilter):
    lookup = "task_identifier"


class QueueFilter(_ChoiceFilter):
    """A named queue: the first :data:`CHOICES` by name are offered, any works."""

    title = "queue"
    parameter_name = "queue"
    lookup = "job_queue__queue_name"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        names = JobQueue.objects.order_by("queue_name").values_list("queue_name", flat=True)
        return [(name, name) for name in names[:CHOICES]]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value_checked()
        return queryset if value is None else queryset.filter(**{self.lookup: value})


class FinishedQueueFilter(QueueFilter):
    lookup = "queue_name"
