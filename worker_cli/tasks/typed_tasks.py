"""Typed tasks: a task whose payload parameter is annotated receives that type.

::

    @dataclass
    class SendEmail:
        IDENTIFIER: ClassVar[str] = "send_email"
        to: str

    async def task(payload: SendEmail, helpers: Helpers) -> None: ...

When a task is loaded, :func:`typed_task` reads the annotation of its first
parameter (string annotations too, resolved with :func:`typing.get_type_hints`
in the task's module), compiles a decoder for it (:mod:`.payload_types`) and
wraps the function once: the wrapper builds the instance from the job's JSON,
then calls the task. A payload that does not fit raises
:class:`~worker_cli.errors.PayloadError` before the task is called, and the
job fails permanently. A task whose annotation names no dataclass,
TypedDict, pydantic model or Enum (none, ``Any``, ``dict[str, bool]``,
``list[int]``, ...) is returned as it is: it gets the JSON, as before typed
payloads, and costs nothing per job.

:func:`typed_task_list` builds a ``task_list`` from functions whose payload
class names its task, without repeating the identifiers.
"""

from __future__ import annotations

import functools
import inspect
import sys
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from ..errors import TaskLoadError
from ..jobs.payloads import NamedPayload, named_task
from .payload_types import (
    UnsupportedAnnotation,
    compile_decoder,
    decode,
    names_a_payload_class,
    type_name,
)

if TYPE_CHECKING:
    from .helpers import Helpers

__all__ = ["TypedTaskFunction", "payload_annotation", "typed_task", "typed_task_list"]

P = TypeVar("P")
N = TypeVar("N", bound=NamedPayload)

#: A task function taking a payload of type ``P``: ``async def task(payload: P,
#: helpers: Helpers) -> None`` (or a plain ``def``).
TypedTaskFunction: TypeAlias = Callable[[P, "Helpers"], object]


def payload_annotation(function: Callable[..., Any], source: str) -> Any:
    """The resolved annotation of ``function``'s payload (first) parameter, or
    None when it has none. Only that annotation is resolved: a ``helpers:
    Helpers`` imported under ``TYPE_CHECKING`` does not matter."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin, say: nothing to read
        return None
    parameters = list(signature.parameters.values())
    if not parameters or parameters[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        return None
    first = parameters[0]
    if first.annotation is inspect.Parameter.empty:
        return None
    # get_type_hints resolves a string (or a ForwardRef nested in list["Item"])
    # in the namespace of the task's module.
    holder = types.SimpleNamespace(__annotations__={first.name: first.annotation})
    try:
        hints = typing.get_type_hints(
            holder, globalns=_module_namespace(function), include_extras=True
        )
        return hints[first.name]
    except Exception as exc:
        raise TaskLoadError(
            f"{source}: cannot resolve the payload annotation {_shown(first.annotation)} "
            f"({type(exc).__name__}: {exc})"
        ) from None


def typed_task(
    identifier: str, function: Callable[[Any, Helpers], Any], is_async: bool, source: str
) -> Callable[[Any, Helpers], Any]:
    """``function`` itself when its payload names no payload class; else a wrapper of the
    same kind (a coroutine function stays one) that hands it the typed payload.
    Raises TaskLoadError naming ``source`` when the annotation is unsupported,
    or names another task (``IDENTIFIER``)."""
    annotation = payload_annotation(function, source)
    if annotation is None or not names_a_payload_class(annotation):
        return function
    try:
        decoder = compile_decoder(annotation)
    except UnsupportedAnnotation as exc:
        raise TaskLoadError(f"{source}: payload annotation {_shown(annotation)}: {exc}") from None
    named = named_task(annotation) if isinstance(annotation, type) else None
    if named is not None and named != identifier:
        raise TaskLoadError(
            f"{source}: its payload class {type_name(annotation)} names the task {named!r} "
            f"(IDENTIFIER), not {identifier!r}"
        )
    wrapper: Callable[[Any, Helpers], Any]
    if is_async:

        async def run_typed(payload: Any, helpers: Helpers) -> Any:
            return await function(decode(decoder, payload), helpers)

        wrapper = run_typed
    else:

        def run_typed_plain(payload: Any, helpers: Helpers) -> Any:
            return function(decode(decoder, payload), helpers)

        wrapper = run_typed_plain
    functools.update_wrapper(wrapper, function)
    return wrapper


def typed_task_list(*functions: TypedTaskFunction[N]) -> dict[str, Callable[[Any, Helpers], Any]]:
    """A ``task_list`` for :func:`worker_cli.run` from task functions whose
    payload class names its task (``IDENTIFIER``)::

        run(task_list=typed_task_list(send_email, resize_image))

    Raises TaskLoadError for a function whose payload class names no task, and
    for two functions of one task.
    """
    result: dict[str, Callable[[Any, Helpers], Any]] = {}
    for function in functions:
        source = f"typed_task_list: {getattr(function, '__qualname__', repr(function))}"
        annotation = payload_annotation(function, source)
        identifier = named_task(annotation) if isinstance(annotation, type) else None
        if identifier is None:
            raise TaskLoadError(
                f"{source}: its payload annotation {_shown(annotation)} is not a class that "
                "names its task (IDENTIFIER: ClassVar[str] = 'task_name')"
            )
        if identifier in result:
            raise TaskLoadError(f"{source}: another function is already the task {identifier!r}")
        result[identifier] = function
    return result


def _module_namespace(function: Any) -> dict[str, Any]:
    """The globals string annotations of ``function`` are resolved in."""
    target = inspect.unwrap(function)
    while True:
        if isinstance(target, functools.partial):
            target = target.func
        elif inspect.ismethod(target):
            target = target.__func__
        else:
            break
    namespace = getattr(target, "__globals__", None)
    if namespace is None:  # an object with a __call__ method
        call = getattr(type(target), "__call__", None)  # noqa: B004
        namespace = getattr(call, "__globals__", None)
    if namespace is None:
        module = sys.modules.get(getattr(target, "__module__", "") or "")
        namespace = vars(module) if module is not None else {}
    return dict(namespace)


def _shown(annotation: Any) -> str:
    if annotation is None:
        return "(none)"
    return repr(annotation) if isinstance(annotation, str) else repr(type_name(annotation))
