"""Payloads as ``add_job`` takes them: typed instances, and classes that name their task.

A payload may be plain JSON data, a dataclass instance, a pydantic model or a
TypedDict (a dict at run time). A payload class names its task with a class
variable, as the Rust port's typed jobs do with ``IDENTIFIER``::

    @dataclass
    class SendEmail:
        IDENTIFIER: ClassVar[str] = "send_email"
        to: str

    await utils.add_job(SendEmail(to="a@b.c"))  # a job of "send_email"

:func:`job_identity` reads ``add_job``'s first two arguments (the async and
sync utilities share it); :func:`json_default` is the ``default`` of every
``json.dumps`` that encodes payloads, so an instance nested anywhere in a
payload is encoded too.
"""

from __future__ import annotations

import dataclasses
import enum
import sys
from typing import Any, ClassVar, Protocol

from ..errors import JobSpecError

__all__ = [
    "NamedPayload",
    "check_named_task",
    "job_identity",
    "json_default",
    "json_ready",
    "named_task",
]

_JSON_TYPES = frozenset({dict, list, str, int, float, bool, type(None)})


class NamedPayload(Protocol):
    """A payload whose class names its task: ``IDENTIFIER: ClassVar[str] = "send_email"``."""

    IDENTIFIER: ClassVar[str]


def named_task(payload_class: object) -> str | None:
    """The task a payload class (or instance) names with ``IDENTIFIER``, if any."""
    cls = payload_class if isinstance(payload_class, type) else type(payload_class)
    if cls in _JSON_TYPES:
        return None
    identifier = getattr(cls, "IDENTIFIER", None)
    return identifier if isinstance(identifier, str) else None


def job_identity(identifier: object, payload: Any) -> tuple[str, Any]:
    """``add_job(identifier, payload)`` or ``add_job(payload)``: the task
    identifier, and the payload as JSON data (an instance becomes a dict).

    Raises JobSpecError when the payload's class names another task than
    ``identifier``, or when neither names one.
    """
    if isinstance(identifier, str):
        check_named_task(identifier, payload)
        return identifier, json_ready(payload)
    if isinstance(identifier, type):
        raise JobSpecError(
            "identifier", f"is the class {identifier.__qualname__}; pass an instance of it"
        )
    named = named_task(identifier)
    if named is None:
        raise JobSpecError(
            "identifier",
            "must be a task identifier (a string) or a payload whose class names its task "
            f"(IDENTIFIER: ClassVar[str]), not {type(identifier).__qualname__}",
        )
    if payload is not None:
        raise JobSpecError(
            "payload",
            f"is given twice: the {type(identifier).__qualname__} given first is the payload",
        )
    return named, json_ready(identifier)


def check_named_task(identifier: str, payload: Any) -> None:
    """Raise JobSpecError if the payload's class names a task other than ``identifier``."""
    named = named_task(payload)
    if named is not None and named != identifier:
        name = type(payload).__qualname__
        raise JobSpecError(
            "identifier",
            f"is {identifier!r}, but the payload is a {name}, whose IDENTIFIER names the "
            f"task {named!r}; leave the identifier out (add_job({name}(...)))",
        )


def json_ready(payload: Any) -> Any:
    """``payload`` with a dataclass instance, pydantic model or Enum at its top
    turned into JSON data (what is nested is left to :func:`json_default`)."""
    if type(payload) in _JSON_TYPES:
        return payload
    try:
        return json_default(payload)
    except TypeError:
        return payload  # json.dumps will say what cannot be encoded


def json_default(value: Any) -> Any:
    """``json.dumps(default=...)`` for payloads: a dataclass instance becomes an
    object of its fields, a pydantic model its ``model_dump(mode="json",
    by_alias=True)``, an Enum its value."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    pydantic = sys.modules.get("pydantic")
    base = getattr(pydantic, "BaseModel", None)
    if base is not None and isinstance(value, base):
        return value.model_dump(mode="json", by_alias=True)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")
