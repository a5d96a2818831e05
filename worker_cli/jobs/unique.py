"""Unique jobs: a rule that keeps a job from being added twice over a period.

``add_job(..., unique=UniqueRule(period=300))`` (or a dict with the same
fields) adds the job only if no "same" job blocks it, and returns a
:class:`UniqueJobResult` saying which happened. The rule is checked here
(a bad one raises :class:`UniqueRuleError`, a ``ValueError`` naming the
field) and normalised into the JSON object that the SQL function
``py_add_job`` takes; the SQL side validates it again for SQL callers,
computes the uniqueness hash and does the locking, so Python and SQL callers
always agree on what "the same job" is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import timedelta
from typing import Any, Literal, NamedTuple, TypeAlias

from ..errors import JobSpecError
from ..sql import UNIQUE_RESULT_COLUMNS
from .job import Job, decode_jobs

__all__ = [
    "DEFAULT_BY",
    "DEFAULT_STATES",
    "JOB_COLUMNS_FROM",
    "MAX_PERIOD",
    "ReplaceField",
    "UniqueField",
    "UniqueJobResult",
    "UniqueRule",
    "UniqueRuleError",
    "UniqueSpec",
    "UniqueState",
    "UniqueTimestamp",
    "UniqueUntil",
    "check_keys_payload",
    "results_from_rows",
    "rules_for_specs",
]

UniqueField: TypeAlias = Literal["task", "queue", "payload", "flags"]
UniqueState: TypeAlias = Literal["pending", "running", "retrying", "failed", "succeeded"]
UniqueUntil: TypeAlias = Literal["success", "start"]
UniqueTimestamp: TypeAlias = Literal["run_at", "added"]
ReplaceField: TypeAlias = Literal["run_at", "priority", "max_attempts", "payload", "queue"]

FIELDS: tuple[str, ...] = ("task", "queue", "payload", "flags")
STATES: tuple[str, ...] = ("pending", "running", "retrying", "failed", "succeeded")
REPLACE_FIELDS: tuple[str, ...] = ("run_at", "priority", "max_attempts", "payload", "queue")
DEFAULT_BY: tuple[UniqueField, ...] = ("task", "queue", "payload")
DEFAULT_STATES: tuple[UniqueState, ...] = ("pending", "running", "retrying", "succeeded")
DEFAULT_PERIOD = 60.0

#: The longest finite period, in seconds (100 years); longer is "infinity".
MAX_PERIOD = 3_155_760_000


class UniqueRuleError(JobSpecError):
    """A uniqueness rule is invalid; ``field`` is ``unique.<option>``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UniqueRule:
    """When two jobs are "the same", and for how long the first blocks the second.

    - ``period``: seconds (or a ``timedelta``) the job blocks duplicates, or
      ``"infinity"``: as long as its row exists (until it succeeds).
    - ``by``: the fields compared: ``task``, ``queue``, ``payload``, ``flags``.
    - ``keys``: compare only these payload keys instead of the whole payload.
    - ``states``: the states of the existing job that block a new one.
    - ``until``: ``"success"`` holds through running and retries;
      ``"start"`` releases when the job starts (only a pending job blocks).
    - ``timestamp``: the period counts from ``"run_at"`` (a job scheduled in
      the future blocks for its delay plus the period) or from when it was
      ``"added"``.
    - ``replace``: fields of a *pending* existing job to overwrite with this
      call's values on a conflict.
    """

    period: float | timedelta | Literal["infinity"] = DEFAULT_PERIOD
    by: Sequence[UniqueField] = DEFAULT_BY
    keys: Sequence[str] | None = None
    states: Sequence[UniqueState] = DEFAULT_STATES
    until: UniqueUntil = "success"
    timestamp: UniqueTimestamp = "run_at"
    replace: Sequence[ReplaceField] = ()

    @classmethod
    def coerce(cls, rule: UniqueRule | Mapping[str, Any], field: str = "unique") -> UniqueRule:
        """Accept a UniqueRule or a dict with the same field names."""
        if isinstance(rule, UniqueRule):
            return rule
        if not isinstance(rule, Mapping):
            raise UniqueRuleError(
                field, f"must be a UniqueRule or a dict, not {type(rule).__name__}"
            )
        unknown = sorted(set(map(str, rule)) - _RULE_FIELDS)
        if unknown:
            expected = ", ".join(sorted(_RULE_FIELDS))
            raise UniqueRuleError(
                field, f"unknown field(s) {', '.join(unknown)}; expected {expected}"
            )
        return cls(**rule)

    def to_json(self, field: str = "unique") -> dict[str, Any]:
        """Validate the rule and return it as the JSON object ``py_add_job`` takes.

        Every default is filled in and every list is sorted and deduplicated,
        so equal rules give equal objects.
        """
        by = _names(f"{field}.by", self.by, FIELDS, may_be_empty=False)
        states = _names(f"{field}.states", self.states, STATES, may_be_empty=False)
        replace = _names(f"{field}.replace", self.replace, REPLACE_FIELDS, may_be_empty=True)
        keys: list[str] | None = None
        if self.keys is not None:
            if (
                isinstance(self.keys, str | bytes)
                or not isinstance(self.keys, Sequence)
                or not self.keys
                or not all(isinstance(key, str) and key for key in self.keys)
            ):
                raise UniqueRuleError(
                    f"{field}.keys", "must be a non-empty list of payload keys (strings)"
                )
            if "payload" not in by:
                raise UniqueRuleError(
                    f"{field}.keys", 'compares payload keys, so "by" must include "payload"'
                )
            keys = sorted(set(self.keys))
        if self.until not in ("success", "start"):
            raise UniqueRuleError(
                f"{field}.until", f'must be "success" or "start", not {self.until!r}'
            )
        if self.until == "start" and "pending" not in states:
            raise UniqueRuleError(
                f"{field}.until",
                '"start" releases the lock when the job starts, so only a pending job blocks; '
                '"states" must include "pending"',
            )
        if self.timestamp not in ("run_at", "added"):
            raise UniqueRuleError(
                f"{field}.timestamp", f'must be "run_at" or "added", not {self.timestamp!r}'
            )
        return {
            "period": _period(f"{field}.period", self.period),
            "by": by,
            "keys": keys,
            "states": states,
            "until": self.until,
            "timestamp": self.timestamp,
            "replace": replace,
        }


#: What ``add_job(unique=...)`` accepts.
UniqueSpec: TypeAlias = UniqueRule | Mapping[str, Any]

_RULE_FIELDS = frozenset(f.name for f in fields(UniqueRule))


class UniqueJobResult(NamedTuple):
    """What ``add_job(..., unique=...)`` did.

    - ``conflict`` False: ``job`` is the job just added (or the pending job
      its ``job_key`` updated).
    - ``conflict`` True: nothing was added; ``job`` is the existing job that
      blocked it, or None when that job has already succeeded (its row is
      gone); ``job_id`` is its id either way, ``conflict_state`` the state it
      blocked in, and ``replaced`` whether the ``replace`` fields were
      written to it (only a pending job is changed).
    """

    job: Job | None
    conflict: bool
    job_id: int
    conflict_state: UniqueState | None = None
    replaced: bool = False


#: Where the job's columns start in a result row of ``add_unique_job(s)``.
JOB_COLUMNS_FROM = len(UNIQUE_RESULT_COLUMNS)


def results_from_rows(
    rows: Sequence[Sequence[Any]], task_names: Mapping[int, str], queue_names: Mapping[int, str]
) -> list[UniqueJobResult]:
    """Results from rows of ``add_unique_job(s)``: statements.UNIQUE_RESULT_COLUMNS,
    then the job's columns (all null for a job that has already succeeded),
    read with :func:`~worker_cli.db.raw_json.read_payloads_raw`."""
    found = [row for row in rows if row[JOB_COLUMNS_FROM] is not None]
    jobs = iter(decode_jobs(found, task_names, queue_names, first=JOB_COLUMNS_FROM))
    return [
        UniqueJobResult(
            next(jobs) if row[JOB_COLUMNS_FROM] is not None else None,
            **dict(zip(UNIQUE_RESULT_COLUMNS, row, strict=False)),
        )
        for row in rows
    ]


def rules_for_specs(
    unique: UniqueSpec | Sequence[UniqueSpec | None], payloads: Sequence[Any]
) -> dict[str, Any] | list[dict[str, Any] | None]:
    """The rules of ``add_jobs(specs, unique=...)`` as JSON: one object for all
    specs, or one (or None) per spec; ``payloads`` are those of the specs."""
    if isinstance(unique, UniqueRule | Mapping):
        rule = UniqueRule.coerce(unique).to_json()
        for index, payload in enumerate(payloads):
            check_keys_payload(rule, payload, field=f"specs[{index}].unique")
        return rule
    if isinstance(unique, str | bytes) or not isinstance(unique, Sequence):
        raise UniqueRuleError(
            "unique", "must be a rule (a UniqueRule or a dict) or a list with one per spec"
        )
    if len(unique) != len(payloads):
        raise UniqueRuleError(
            "unique", f"has {len(unique)} rules for {len(payloads)} specs; give one per spec"
        )
    rules: list[dict[str, Any] | None] = []
    for index, (item, payload) in enumerate(zip(unique, payloads, strict=True)):
        if item is None:
            rules.append(None)
            continue
        rule = UniqueRule.coerce(item, field=f"unique[{index}]").to_json(field=f"unique[{index}]")
        check_keys_payload(rule, payload, field=f"unique[{index}]")
        rules.append(rule)
    return rules


def check_keys_payload(rule: Mapping[str, Any], payload: Any, field: str = "unique") -> None:
    """Raise if the rule compares payload keys but the payload is not an object."""
    if rule.get("keys") is not None and payload is not None and not isinstance(payload, Mapping):
        raise UniqueRuleError(
            f"{field}.keys",
            "compares keys of the payload, which must be a JSON object, "
            f"not {type(payload).__name__}",
        )


def _names(
    field: str, values: object, allowed: tuple[str, ...], *, may_be_empty: bool
) -> list[str]:
    if isinstance(values, str | bytes) or not isinstance(values, Sequence):
        raise UniqueRuleError(field, f"must be a list of strings from {', '.join(allowed)}")
    bad = sorted({str(value) for value in values if value not in allowed})
    if bad:
        raise UniqueRuleError(
            field, f"unknown value(s) {', '.join(bad)}; expected some of {', '.join(allowed)}"
        )
    if not values and not may_be_empty:
        raise UniqueRuleError(field, "must not be empty")
    return sorted(set(values))


def _period(field: str, period: object) -> float | Literal["infinity"]:
    if period == "infinity":
        return "infinity"
    if isinstance(period, timedelta):
        seconds = period.total_seconds()
    elif isinstance(period, int | float) and not isinstance(period, bool):
        seconds = float(period)
    else:
        raise UniqueRuleError(
            field, f'must be a positive number of seconds or "infinity", not {period!r}'
        )
    if math.isinf(seconds) and seconds > 0:
        return "infinity"
    if math.isnan(seconds) or seconds <= 0:
        raise UniqueRuleError(
            field, f'must be a positive number of seconds or "infinity", not {period!r}'
        )
    if seconds > MAX_PERIOD:
        raise UniqueRuleError(field, f'{seconds:g} seconds is more than 100 years; use "infinity"')
    return seconds
