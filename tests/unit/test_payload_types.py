"""Typed payloads without a database: the JSON-to-type converter, loading typed
tasks, and encoding typed payloads for add_job."""

from __future__ import annotations

import asyncio
import enum
import inspect
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, NotRequired, Optional, Required, TypedDict

import pydantic
import pytest

from worker_cli import JobSpecError, PayloadError, TaskLoadError, typed_task_list
from worker_cli.client.job_plans import spec_record
from worker_cli.jobs.job_spec import encode_payload
from worker_cli.jobs.payloads import job_identity
from worker_cli.tasks.loader import Task, load_task_directory, make_task_list
from worker_cli.tasks.payload_types import (
    UnsupportedAnnotation,
    compile_decoder,
    decode,
    names_a_payload_class,
)

pytestmark = pytest.mark.unit


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


@dataclass
class Item:
    sku: str
    qty: int


@dataclass
class Order:
    IDENTIFIER: ClassVar[str] = "order"
    to: str
    items: list[Item]
    note: str | None = None
    kind: Literal["a", "b"] = "a"
    weights: dict[str, float] = field(default_factory=dict)
    color: Optional[Color] = None  # noqa: UP045  (the old spelling works too)
    children: list[Order] = field(default_factory=list)


@dataclass
class Positive:
    n: int

    def __post_init__(self) -> None:
        if self.n <= 0:
            raise ValueError(f"n must be positive, not {self.n}")


class Mail(TypedDict):
    to: str
    cc: NotRequired[list[str]]


class Loose(TypedDict, total=False):
    id: Required[int]
    tag: str


class Model(pydantic.BaseModel):
    IDENTIFIER: ClassVar[str] = "model"
    to: str
    items: list[Item] = []
    reply_to: str | None = pydantic.Field(default=None, alias="replyTo")


def fits(annotation: Any, payload: Any) -> Any:
    return decode(compile_decoder(annotation), payload)


def misfit(annotation: Any, payload: Any) -> str:
    with pytest.raises(PayloadError) as caught:
        fits(annotation, payload)
    assert str(caught.value) == f"{caught.value.field}: {caught.value.reason}"
    return str(caught.value)


def test_a_nested_dataclass_is_built_and_undeclared_keys_are_ignored() -> None:
    payload = {
        "to": "a@b.c",
        "items": [{"sku": "x", "qty": 2, "colour": "blue"}],
        "weights": {"x": 1, "y": 2.5},
        "color": "red",
        "children": [{"to": "c@d.e", "items": []}],
        "_cron": {"ts": "2026-11-21T04:30:00.000Z", "backfilled": False},
    }
    order = fits(Order, payload)
    assert order == Order(
        to="a@b.c",
        items=[Item("x", 2)],
        weights={"x": 1.0, "y": 2.5},
        color=Color.RED,
        children=[Order(to="c@d.e", items=[])],
    )
    assert type(order.weights["x"]) is float
    assert payload["items"][0] == {"sku": "x", "qty": 2, "colour": "blue"}  # not changed


@pytest.mark.parametrize(
    "payload,message",
    [
        ({"items": []}, "payload.to: missing"),
        (
            {"to": "x", "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 1}, {"sku": "c"}]},
            "payload.items[2].qty: missing",
        ),
        (
            {"to": "x", "items": [{"sku": "a", "qty": 1}] * 2 + [{"sku": "c", "qty": "2"}]},
            "payload.items[2].qty: expected int, got str",
        ),
        ({"to": 1, "items": []}, "payload.to: expected str, got int"),
        ({"to": None, "items": []}, "payload.to: expected str, got None"),
        ({"to": "x", "items": {}}, "payload.items: expected list, got dict"),
        ({"to": "x", "items": [], "kind": "c"}, 'payload.kind: expected one of "a", "b", got "c"'),
        (
            {"to": "x", "items": [], "weights": {"a b": "1"}},
            'payload.weights["a b"]: expected float, got str',
        ),
        (
            {"to": "x", "items": [], "weights": {"k": True}},
            "payload.weights.k: expected float, got bool",
        ),
        (
            {"to": "x", "items": [], "color": "blue"},
            'payload.color: expected one of "red", "green" (Color), got "blue"',
        ),
        (
            {"to": "x", "items": [], "children": [{"to": "y"}]},
            "payload.children[0].items: missing",
        ),
        ([], "payload: expected an object (Order), got list"),
        (None, "payload: expected an object (Order), got None"),
    ],
)
def test_a_misfit_names_the_field_and_the_problem(payload: Any, message: str) -> None:
    assert misfit(Order, payload) == message


@pytest.mark.parametrize(
    "annotation,good,bad,message",
    [
        (int, 3, 3.0, "payload: expected int, got float"),
        (int, 3, True, "payload: expected int, got bool"),
        (int, 3, "3", "payload: expected int, got str"),
        (float, 3.5, True, "payload: expected float, got bool"),
        (bool, False, 0, "payload: expected bool, got int"),
        (str, "x", 1, "payload: expected str, got int"),
        (None, None, 0, "payload: expected None, got int"),
        (Literal[1, True], 1, 1.0, "payload: expected one of 1, true, got 1.0"),
        (Literal["x"], "x", ["x"], 'payload: expected one of "x", got list'),
        (list[int], [1, 2], [1, "2"], "payload[1]: expected int, got str"),
        (dict[str, int], {"a": 1}, {"a": 1, "b": None}, "payload.b: expected int, got None"),
        (int | str, "x", [1], "payload: expected int or str, got list"),
        (Item | None, None, {"sku": "x"}, "payload.qty: missing"),
        (Annotated[int, "doc"], 1, "1", "payload: expected int, got str"),
    ],
)
def test_json_scalars_are_strict(annotation: Any, good: Any, bad: Any, message: str) -> None:
    assert fits(annotation, good) == good
    assert misfit(annotation, bad) == message


def test_a_float_takes_an_integer_and_a_literal_keeps_its_type() -> None:
    value = fits(float, 2)
    assert value == 2.0 and type(value) is float
    assert fits(Literal[True, 1], 1) == 1 and fits(Literal[True, 1], True) is True


def test_a_union_explains_with_the_member_the_value_was_meant_for() -> None:
    assert fits(int | Item, {"sku": "a", "qty": 1}) == Item("a", 1)
    assert misfit(int | Item, {"sku": "a", "qty": "1"}) == "payload.qty: expected int, got str"


def test_post_init_refusing_the_values_is_a_misfit() -> None:
    assert fits(Positive, {"n": 1}) == Positive(1)
    assert misfit(Positive, {"n": 0}) == (
        "payload: Positive refused it: ValueError: n must be positive, not 0"
    )


def test_typeddicts_keep_declared_keys_and_know_what_is_required() -> None:
    # This module has `from __future__ import annotations`: the NotRequired
    # and Required below are strings Python 3.11 cannot see at class creation.
    assert fits(Mail, {"to": "x", "other": 1}) == {"to": "x"}
    assert fits(Mail, {"to": "x", "cc": ["y"]}) == {"to": "x", "cc": ["y"]}
    assert misfit(Mail, {"cc": []}) == "payload.to: missing"
    assert misfit(Mail, {"to": "x", "cc": [1]}) == "payload.cc[0]: expected str, got int"
    assert fits(Loose, {"id": 1}) == {"id": 1}
    assert misfit(Loose, {"tag": "x"}) == "payload.id: missing"


def test_pydantic_models_are_validated_by_pydantic() -> None:
    model = fits(Model, {"to": "x", "replyTo": "y", "items": [{"sku": "a", "qty": 1}]})
    assert model == Model(to="x", replyTo="y", items=[Item("a", 1)])
    assert misfit(Model, {"items": []}) == "payload.to: missing"
    message = misfit(
        Model, {"to": "x", "items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": "x"}]}
    )
    assert message.startswith("payload.items[1].qty: Input should be a valid integer")
    assert misfit(list[Model], [{"to": "x"}, {}]) == "payload[1].to: missing"


@pytest.mark.parametrize(
    "annotation,message",
    [
        (set[int], "set[int] is not supported (supported: dataclasses, TypedDicts, pydantic"),
        (datetime, "datetime is not supported"),
        (dict[int, str], "dict[int, str] is not supported: JSON object keys are strings"),
        (Literal[b"x"], "Literal[b'x'] is not supported"),
        (tuple[int, int], "tuple[int, int] is not supported"),
    ],
)
def test_unsupported_annotations_are_refused_when_compiled(annotation: Any, message: str) -> None:
    with pytest.raises(UnsupportedAnnotation) as caught:
        compile_decoder(annotation)
    assert str(caught.value).startswith(message)


@pytest.mark.parametrize(
    "annotation,typed",
    [
        (Order, True),
        (Mail, True),
        (Model, True),
        (Color, True),
        (list[Item], True),
        (Item | None, True),
        (dict[str, Annotated[Item, "x"]], True),
        (Any, False),
        (object, False),
        (dict, False),
        (dict[str, Any], False),
        (dict[str, bool], False),
        (list[int], False),
        (int | None, False),
        (Literal["a"], False),
        (datetime, False),
    ],
)
def test_only_annotations_naming_a_payload_class_are_built(annotation: Any, typed: bool) -> None:
    assert names_a_payload_class(annotation) is typed


# --- Loading typed tasks ---------------------------------------------------------


async def send_order(payload: Order, helpers: Any) -> Order:
    return payload


def send_order_plain(payload: Order, helpers: Any) -> Order:
    return payload


def test_untyped_tasks_are_not_wrapped() -> None:
    async def untyped(payload, helpers):  # type: ignore[no-untyped-def]
        return payload

    def with_dict(payload: dict[str, Any], helpers: Any) -> None:
        pass

    def with_any(payload: Any, helpers: Any) -> None:
        pass

    # A hint of the JSON's shape was never checked, and is not now.
    def with_shape(payload: dict[str, bool], helpers: Any) -> None:
        pass

    def with_unknown(payload: datetime, helpers: Any) -> None:
        pass

    functions = [untyped, with_dict, with_any, with_shape, with_unknown, print]
    tasks = make_task_list({f.__name__: f for f in functions})
    assert [tasks[f.__name__].function for f in functions] == functions


def test_a_typed_task_keeps_its_kind_and_gets_an_instance() -> None:
    typed = make_task_list({"order": send_order})["order"]
    plain = make_task_list({"order": send_order_plain})["order"]
    payload = {"to": "x", "items": [{"sku": "a", "qty": 1}]}
    assert typed.is_async and inspect.iscoroutinefunction(typed.function)
    assert not plain.is_async and not inspect.iscoroutinefunction(plain.function)
    assert asyncio.run(typed.function(payload, None)) == Order("x", [Item("a", 1)])
    assert plain.function(payload, None) == Order("x", [Item("a", 1)])
    with pytest.raises(PayloadError, match=r"^payload\.to: missing$"):
        plain.function({"items": []}, None)


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_a_task_folder_with_string_annotations(tmp_path: Path) -> None:
    write(
        tmp_path / "send_email.py",
        "from __future__ import annotations\n"
        "from dataclasses import dataclass\n"
        "from typing import TYPE_CHECKING, ClassVar\n"
        "if TYPE_CHECKING:\n"
        "    from worker_cli import Helpers  # never imported: only the payload is resolved\n"
        "@dataclass\n"
        "class Address:\n"
        "    email: str\n"
        "@dataclass\n"
        "class SendEmail:\n"
        "    IDENTIFIER: ClassVar[str] = 'send_email'\n"
        "    to: list[Address]\n"
        "async def task(payload: SendEmail, helpers: Helpers) -> SendEmail:\n"
        "    return payload\n",
    )
    task = load_task_directory(tmp_path)["send_email"]
    sent = asyncio.run(task.function({"to": [{"email": "a@b.c"}]}, None))
    assert type(sent).__name__ == "SendEmail" and sent.to[0].email == "a@b.c"


@pytest.mark.parametrize(
    "text,message",
    [
        (
            "from __future__ import annotations\n"
            "async def task(payload: SendEmail, helpers):\n    pass\n",
            "task file 'mail.py': cannot resolve the payload annotation 'SendEmail' "
            "(NameError: name 'SendEmail' is not defined)",
        ),
        (
            "from __future__ import annotations\nfrom dataclasses import dataclass\n"
            "@dataclass\nclass Mail:\n    to: Address\n"
            "async def task(payload: Mail, helpers):\n    pass\n",
            "task file 'mail.py': payload annotation 'Mail': the annotations of Mail cannot be "
            "resolved (NameError: name 'Address' is not defined)",
        ),
        (
            "import datetime\nfrom typing import TypedDict\n"
            "class Mail(TypedDict):\n    sent: datetime.date\n"
            "async def task(payload: list[Mail], helpers):\n    pass\n",
            "task file 'mail.py': payload annotation 'list[Mail]': Mail.sent: "
            "date is not supported (supported: dataclasses,",
        ),
        (
            "from dataclasses import dataclass\nfrom typing import ClassVar\n"
            "@dataclass\nclass Mail:\n    IDENTIFIER: ClassVar[str] = 'send_email'\n"
            "def task(payload: Mail, helpers):\n    pass\n",
            "task file 'mail.py': its payload class Mail names the task 'send_email' "
            "(IDENTIFIER), not 'mail'",
        ),
    ],
)
def test_a_bad_annotation_fails_to_load_with_one_line(
    tmp_path: Path, text: str, message: str
) -> None:
    write(tmp_path / "mail.py", text)
    with pytest.raises(TaskLoadError) as caught:
        load_task_directory(tmp_path)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_typed_task_list_takes_identifiers_from_payload_classes() -> None:
    async def model_task(payload: Model, helpers: Any) -> None:
        pass

    tasks = typed_task_list(send_order, model_task)
    assert tasks == {"order": send_order, "model": model_task}
    loaded = make_task_list(tasks)
    assert isinstance(loaded["order"], Task) and loaded["order"].function is not send_order

    def unnamed(payload: Item, helpers: Any) -> None:
        pass

    with pytest.raises(TaskLoadError, match=r"unnamed: its payload annotation 'Item' is not a"):
        typed_task_list(unnamed)  # type: ignore[type-var]
    with pytest.raises(TaskLoadError, match="another function is already the task 'order'"):
        typed_task_list(send_order, send_order_plain)


def test_a_task_list_entry_under_another_name_than_its_payload_class_names() -> None:
    with pytest.raises(TaskLoadError, match=r"names the task 'order' \(IDENTIFIER\), not 'mail'"):
        make_task_list({"mail": send_order})


# --- add_job's side ----------------------------------------------------------------


def test_job_identity_reads_the_task_from_the_payload_class() -> None:
    order = Order("x", [Item("a", 1)])
    identifier, payload = job_identity(order, None)
    assert identifier == "order"
    assert json.loads(encode_payload(payload) or "") == {
        "to": "x",
        "items": [{"sku": "a", "qty": 1}],
        "note": None,
        "kind": "a",
        "weights": {},
        "color": None,
        "children": [],
    }
    assert job_identity("order", order)[0] == "order"
    assert job_identity("anything", {"to": "x"}) == ("anything", {"to": "x"})
    model = job_identity(Model(to="x", replyTo="y"), None)
    assert model == ("model", {"to": "x", "items": [], "replyTo": "y"})


@pytest.mark.parametrize(
    "identifier,payload,message",
    [
        (
            "mail",
            Order("x", []),
            "identifier: is 'mail', but the payload is a Order, whose IDENTIFIER names the task "
            "'order'; leave the identifier out (add_job(Order(...)))",
        ),
        (
            Item("a", 1),
            None,
            "identifier: must be a task identifier (a string) or a payload whose class names "
            "its task (IDENTIFIER: ClassVar[str]), not Item",
        ),
        (Order, None, "identifier: is the class Order; pass an instance of it"),
        (
            Order("x", []),
            {"to": "y"},
            "payload: is given twice: the Order given first is the payload",
        ),
    ],
)
def test_job_identity_refuses_what_does_not_add_up(
    identifier: Any, payload: Any, message: str
) -> None:
    with pytest.raises(JobSpecError) as caught:
        job_identity(identifier, payload)
    assert str(caught.value) == message


def test_nested_instances_are_encoded_and_other_objects_still_refused() -> None:
    encoded = encode_payload({"orders": [Item("a", 1)], "color": Color.GREEN, "m": Model(to="x")})
    assert json.loads(encoded or "") == {
        "orders": [{"sku": "a", "qty": 1}],
        "color": "green",
        "m": {"to": "x", "items": [], "replyTo": None},
    }
    with pytest.raises(JobSpecError, match=r"Object of type set is not JSON serializable"):
        encode_payload({"x": {1}})


def test_add_jobs_specs_take_the_identifier_from_the_payload_class() -> None:
    record = spec_record({"payload": Item("a", 1), "identifier": "item"}, 0)
    assert record["identifier"] == "item" and record["payload"] == {"sku": "a", "qty": 1}
    assert spec_record({"payload": Order("x", [])}, 3)["identifier"] == "order"
    with pytest.raises(JobSpecError, match=r"^specs\[1\]: identifier is required \(unless"):
        spec_record({"payload": Item("a", 1)}, 1)
    with pytest.raises(JobSpecError, match=r"^specs\[2\]\.identifier: is 'mail', but the"):
        spec_record({"identifier": "mail", "payload": Order("x", [])}, 2)
