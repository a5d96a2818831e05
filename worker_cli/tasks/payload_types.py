"""Typed payloads: building the value a task's payload annotation names from a job's JSON.

:func:`compile_decoder` turns an annotation into a decoder once, when the task
is loaded; each job then costs one call of it. :func:`decode` runs a decoder
and turns a mismatch into :class:`~worker_cli.errors.PayloadError` naming the
field (``payload.items[2].qty: expected int, got str``).

It is as strict as JSON is: ``int`` takes a JSON integer (not ``1.5``, ``"1"``
or ``true``), ``float`` any number, ``str`` a string, ``bool`` true or false.
Supported: dataclasses (nested, with defaults), TypedDicts (``total``,
``Required``, ``NotRequired``), pydantic models (validated by pydantic, with
the model's own configuration), ``list[X]``, ``dict[str, X]``, unions
(``X | None``, ``Optional[X]``), ``Literal``, ``Enum`` (by value),
``Annotated``, ``NewType``, ``str``, ``int``, ``float``, ``bool``, ``None``
and ``Any``. Keys of a JSON object that a dataclass or TypedDict does not
declare are ignored: a producer that adds a field (a newer Node service, the
``_cron`` key of a crontab job) does not break a consumer.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, NotRequired, Required, TypeAlias, Union

from ..errors import PayloadError

__all__ = [
    "Decoder",
    "UnsupportedAnnotation",
    "compile_decoder",
    "decode",
    "names_a_payload_class",
]

#: Builds a payload value from JSON, raising :class:`_Misfit` when it does not fit.
Decoder: TypeAlias = Callable[[Any], Any]

_NONE = type(None)
_SUPPORTED = (
    "dataclasses, TypedDicts, pydantic models, list[...], dict[str, ...], unions such as "
    "X | None, Literal, Enum, str, int, float, bool, None and Any"
)


class UnsupportedAnnotation(Exception):
    """An annotation no decoder can be built for; the message says which part and why."""


class _Misfit(Exception):
    """A value that does not fit, raised inside decoders. The path is collected
    on the way out (innermost part first), so a value that fits costs no
    string building."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
        self.parts: list[str] = []

    def at(self, part: str) -> _Misfit:
        self.parts.append(part)
        return self


def decode(decoder: Decoder, payload: Any) -> Any:
    """The typed value of ``payload``, or PayloadError naming what does not fit."""
    try:
        return decoder(payload)
    except _Misfit as misfit:
        field = "payload" + "".join(reversed(misfit.parts))
        raise PayloadError(field, misfit.reason) from None


def names_a_payload_class(annotation: Any) -> bool:
    """True when ``annotation`` names a dataclass, TypedDict, pydantic model or
    Enum anywhere (``SendEmail``, ``list[Item]``, ``Order | None``). Only
    those are built: any other annotation (``Any``, ``dict``, ``dict[str,
    bool]``, ``list[int]``, ``str``) only says what the JSON looks like, was
    never checked, and the task gets the JSON as it is."""
    if isinstance(annotation, type):
        return (
            dataclasses.is_dataclass(annotation)
            or _is_typeddict(annotation)
            or issubclass(annotation, enum.Enum)
            or _is_pydantic_model(annotation)
        )
    if hasattr(annotation, "__supertype__"):  # NewType
        return names_a_payload_class(annotation.__supertype__)
    origin = typing.get_origin(annotation)
    if origin is Literal:
        return False
    args = typing.get_args(annotation)
    if origin is Annotated:
        args = args[:1]
    return any(names_a_payload_class(arg) for arg in args)


def compile_decoder(annotation: Any) -> Decoder:
    """The decoder of ``annotation``; UnsupportedAnnotation if there is none."""
    return _Compiler().compile(annotation)


def type_name(annotation: Any) -> str:
    """How messages name a type: ``SendEmail``, ``int``, ``None``, ``list[Item]``."""
    if annotation is _NONE or annotation is None:
        return "None"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Union or origin is types.UnionType:
        return " | ".join(type_name(arg) for arg in args)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return f"Literal[{', '.join(repr(arg) for arg in args)}]"
    if origin is not None and args:
        name = getattr(origin, "__qualname__", None) or repr(origin).replace("typing.", "")
        return f"{name}[{', '.join(type_name(arg) for arg in args)}]"
    if isinstance(annotation, type):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


def _json_type(value: Any) -> str:
    return "None" if value is None else type(value).__name__


def _show(value: Any) -> str:
    """A JSON value in a message: scalars as JSON (shortened), containers by type."""
    if isinstance(value, dict | list):
        return type(value).__name__
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 40 else text[:37] + "..."


def _key_part(key: str) -> str:
    return f".{key}" if key.isidentifier() else f"[{json.dumps(key, ensure_ascii=False)}]"


def _any(value: Any) -> Any:
    return value


def _exact(kind: type) -> Decoder:
    name = "None" if kind is _NONE else kind.__name__

    def exact(value: Any) -> Any:
        if type(value) is kind:
            return value
        raise _Misfit(f"expected {name}, got {_json_type(value)}")

    return exact


def _float(value: Any) -> Any:
    kind = type(value)
    if kind is float:
        return value
    if kind is int:
        return float(value)
    raise _Misfit(f"expected float, got {_json_type(value)}")


_SCALARS: dict[Any, Decoder] = {
    str: _exact(str),
    int: _exact(int),
    bool: _exact(bool),
    _NONE: _exact(_NONE),
    None: _exact(_NONE),
    float: _float,
}


class _Compiler:
    """Builds the decoders of one annotation; a class met twice (a recursive
    dataclass) gets one decoder."""

    def __init__(self) -> None:
        self._classes: dict[type, Decoder] = {}

    def compile(self, tp: Any) -> Decoder:
        if tp is Any or tp is object:
            return _any
        scalar = _SCALARS.get(tp) if isinstance(tp, type) or tp is None else None
        if scalar is not None:
            return scalar
        origin = typing.get_origin(tp)
        args = typing.get_args(tp)
        if origin is Annotated:
            return self.compile(args[0])
        if hasattr(tp, "__supertype__"):  # NewType
            return self.compile(tp.__supertype__)
        if origin is Union or origin is types.UnionType:
            return self._union(args)
        if origin is Literal:
            return _literal(args)
        if tp is list or origin is list:
            return _list_of(self.compile(args[0]) if args else _any)
        if tp is dict or origin is dict:
            return self._dict(tp, args)
        if isinstance(tp, type):
            known = self._classes.get(tp)
            if known is not None:
                return known
            return self._class(tp)
        raise UnsupportedAnnotation(f"{type_name(tp)} is not supported (supported: {_SUPPORTED})")

    def _class(self, cls: type) -> Decoder:
        model = _pydantic_model(cls)
        if model is not None:
            return model
        if issubclass(cls, enum.Enum):
            return _enum(cls)
        typeddict = _is_typeddict(cls)
        if typeddict or dataclasses.is_dataclass(cls):
            # Registered before its fields are compiled: a field may refer back to it.
            real: list[Decoder] = []
            self._classes[cls] = lambda value: real[0](value)
            build = self._typeddict if typeddict else self._dataclass
            real.append(build(cls, _hints(cls)))
            self._classes[cls] = real[0]
            return real[0]
        raise UnsupportedAnnotation(f"{type_name(cls)} is not supported (supported: {_SUPPORTED})")

    def _union(self, members: tuple[Any, ...]) -> Decoder:
        others = [member for member in members if member is not _NONE]
        if len(others) == 1 and len(members) == 2:
            inner = self.compile(others[0])

            def optional(value: Any) -> Any:
                return None if value is None else inner(value)

            return optional
        return _first_fit([(type_name(m), self.compile(m)) for m in members])

    def _dict(self, tp: Any, args: tuple[Any, ...]) -> Decoder:
        if args and args[0] is not str and args[0] is not Any:
            raise UnsupportedAnnotation(
                f"{type_name(tp)} is not supported: JSON object keys are strings (dict[str, ...])"
            )
        return _dict_of(self.compile(args[1]) if args else _any)

    def _field(self, cls: type, name: str, hint: Any) -> Decoder:
        try:
            return self.compile(hint)
        except UnsupportedAnnotation as exc:
            raise UnsupportedAnnotation(f"{cls.__qualname__}.{name}: {exc}") from None

    def _dataclass(self, cls: type, hints: dict[str, Any]) -> Decoder:
        spec = [
            (
                field.name,
                self._field(cls, field.name, hints.get(field.name, Any)),
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING,
            )
            for field in dataclasses.fields(cls)
            if field.init
        ]
        return _object(cls, spec, construct=True)

    def _typeddict(self, cls: type, hints: dict[str, Any]) -> Decoder:
        required_keys: frozenset[str] = getattr(cls, "__required_keys__", frozenset())
        spec = []
        for key, hint in hints.items():
            required = key in required_keys
            # With string annotations, Python 3.11 cannot see NotRequired when it
            # builds the class: the resolved hint decides.
            while typing.get_origin(hint) in (Required, NotRequired, Annotated):
                if typing.get_origin(hint) is not Annotated:
                    required = typing.get_origin(hint) is Required
                hint = typing.get_args(hint)[0]
            spec.append((key, self._field(cls, key, hint), required))
        return _object(cls, spec, construct=False)


def _is_typeddict(cls: type) -> bool:
    if typing.is_typeddict(cls):
        return True
    # typing_extensions.TypedDict (pydantic asks for it before Python 3.12).
    extensions = sys.modules.get("typing_extensions")
    return extensions is not None and bool(extensions.is_typeddict(cls))


def _hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:
        raise UnsupportedAnnotation(
            f"the annotations of {type_name(cls)} cannot be resolved ({type(exc).__name__}: {exc})"
        ) from None


def _object(cls: type, spec: list[tuple[str, Decoder, bool]], *, construct: bool) -> Decoder:
    """A JSON object to a dataclass instance (``construct``) or a TypedDict
    (a dict of the declared keys); undeclared keys are ignored."""
    name = cls.__qualname__

    def from_object(value: Any) -> Any:
        if type(value) is not dict:
            raise _Misfit(f"expected an object ({name}), got {_json_type(value)}")
        values: dict[str, Any] = {}
        for key, field_decoder, required in spec:
            if key in value:
                try:
                    values[key] = field_decoder(value[key])
                except _Misfit as misfit:
                    raise misfit.at(_key_part(key)) from None
            elif required:
                raise _Misfit("missing").at(_key_part(key))
        if not construct:
            return values
        try:
            return cls(**values)
        except (TypeError, ValueError) as exc:  # __post_init__ refusing the values
            raise _Misfit(f"{name} refused it: {type(exc).__name__}: {exc}") from None

    return from_object


def _list_of(item: Decoder) -> Decoder:
    def list_of(value: Any) -> Any:
        if type(value) is not list:
            raise _Misfit(f"expected list, got {_json_type(value)}")
        if item is _any:
            return value
        result = []
        index = 0
        try:
            for index, entry in enumerate(value):  # noqa: B007  (index names a misfit)
                result.append(item(entry))
        except _Misfit as misfit:
            raise misfit.at(f"[{index}]") from None
        return result

    return list_of


def _dict_of(item: Decoder) -> Decoder:
    def dict_of(value: Any) -> Any:
        if type(value) is not dict:
            raise _Misfit(f"expected an object, got {_json_type(value)}")
        if item is _any:
            return value
        result = {}
        for key, entry in value.items():
            try:
                result[key] = item(entry)
            except _Misfit as misfit:
                raise misfit.at(_key_part(key)) from None
        return result

    return dict_of


def _first_fit(members: list[tuple[str, Decoder]]) -> Decoder:
    """A union: the first member that fits. When none does, the member whose
    mismatch went deepest explains it (it is the one the value was meant for)."""
    names = " or ".join(name for name, _ in members)

    def first_fit(value: Any) -> Any:
        misfits = []
        for _, member in members:
            try:
                return member(value)
            except _Misfit as misfit:
                misfits.append(misfit)
        deepest = max(misfits, key=lambda misfit: len(misfit.parts))
        if deepest.parts:
            raise deepest
        raise _Misfit(f"expected {names}, got {_json_type(value)}")

    return first_fit


def _literal(values: tuple[Any, ...]) -> Decoder:
    for item in values:
        if not isinstance(item, str | int | bool | None) or isinstance(item, enum.Enum):
            raise UnsupportedAnnotation(
                f"Literal[{item!r}] is not supported: a Literal of a payload holds JSON "
                "scalars (strings, numbers, booleans, None)"
            )
    allowed = {(type(item), item) for item in values}
    expected = ", ".join(_show(item) for item in values)

    def literal(value: Any) -> Any:
        try:
            if (type(value), value) in allowed:
                return value
        except TypeError:  # unhashable: a list or an object
            pass
        raise _Misfit(f"expected one of {expected}, got {_show(value)}")

    return literal


def _enum(cls: type[enum.Enum]) -> Decoder:
    members: dict[tuple[type, Any], enum.Enum] = {}
    for member in cls:
        if not isinstance(member.value, str | int | float | bool | None):
            raise UnsupportedAnnotation(
                f"{type_name(cls)} is not supported: the values of an Enum in a payload are "
                f"JSON scalars, not {type(member.value).__name__}"
            )
        members[(type(member.value), member.value)] = member
    expected = ", ".join(_show(member.value) for member in cls)

    def from_value(value: Any) -> Any:
        try:
            return members[(type(value), value)]
        except (KeyError, TypeError):
            raise _Misfit(
                f"expected one of {expected} ({cls.__qualname__}), got {_show(value)}"
            ) from None

    return from_value


def _is_pydantic_model(cls: type) -> bool:
    # pydantic is not imported here: if a task's payload is a model, the task's
    # module has imported it already.
    base = getattr(sys.modules.get("pydantic"), "BaseModel", None)
    return base is not None and issubclass(cls, base)


def _pydantic_model(cls: type) -> Decoder | None:
    """Pydantic validates its own models."""
    if not _is_pydantic_model(cls):
        return None
    validate = cls.model_validate  # type: ignore[attr-defined]
    validation_error: type[Exception] = sys.modules["pydantic"].ValidationError

    def model(value: Any) -> Any:
        try:
            return validate(value)
        except validation_error as exc:
            raise _pydantic_misfit(exc) from None

    return model


def _pydantic_misfit(exc: Any) -> _Misfit:
    errors = exc.errors()
    if not errors:
        return _Misfit(str(exc))
    first = errors[0]
    reason = "missing" if first.get("type") == "missing" else str(first.get("msg", ""))
    if len(errors) > 1:
        reason += f" (and {len(errors) - 1} more error(s))"
    misfit = _Misfit(reason)
    for part in reversed(first.get("loc", ())):
        misfit.at(f"[{part}]" if isinstance(part, int) else _key_part(str(part)))
    return misfit
