"""Typed payloads against PostgreSQL: tasks receive instances, a payload that
does not fit fails its job for good (until rescheduled), and add_job takes
instances whose class names its task."""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, ClassVar, TypedDict

import pydantic
import pytest
from dbhelpers import rows, value

from worker_cli import (
    Events,
    Helpers,
    JobSpecError,
    UniqueRule,
    WorkerUtils,
    make_sync_worker_utils,
    run_once,
    typed_task_list,
)
from worker_cli.worker.pipeline.slots import TASK_THREAD_PREFIX

pytestmark = pytest.mark.db


@dataclass
class Item:
    sku: str
    qty: int


@dataclass
class SendEmail:
    IDENTIFIER: ClassVar[str] = "send_email"
    to: str
    items: list[Item] = field(default_factory=list)
    cc: str | None = None


class Resize(TypedDict):
    image: int
    sizes: list[int]


class Invite(pydantic.BaseModel):
    IDENTIFIER: ClassVar[str] = "invite"
    email: str
    reply_to: str | None = pydantic.Field(default=None, alias="replyTo")


#: What the tasks below were called with: (task, payload, thread name).
calls: list[tuple[str, Any, str]] = []


def record(task: str, payload: Any) -> None:
    calls.append((task, payload, threading.current_thread().name))


async def send_email(payload: SendEmail, helpers: Helpers) -> None:
    record("send_email", payload)
    if payload.cc is not None:
        await helpers.add_job(Invite(email=payload.cc))


def resize(payload: Resize, helpers: Helpers) -> None:
    record("resize", payload)


def invite(payload: Invite, helpers: Helpers) -> None:
    record("invite", payload)


TASKS = {**typed_task_list(send_email, invite), "resize": resize}


@pytest.fixture(autouse=True)
def forget_calls() -> None:
    calls.clear()


async def test_typed_tasks_receive_instances(utils: WorkerUtils, db: str) -> None:
    email = await utils.add_job(SendEmail(to="a@b.c", items=[Item("x", 2)], cc="c@d.e"))
    assert email.task_identifier == "send_email"
    await utils.add_job("resize", Resize(image=7, sizes=[64, 128]))
    await utils.add_job(Invite(email="e@f.g", replyTo="h@i.j"))

    await run_once(db, task_list=TASKS, no_handle_signals=True)

    got = {(task, repr(payload)) for task, payload, _ in calls}
    assert got == {
        ("send_email", repr(SendEmail(to="a@b.c", items=[Item("x", 2)], cc="c@d.e"))),
        ("resize", repr({"image": 7, "sizes": [64, 128]})),
        ("invite", repr(Invite(email="e@f.g", replyTo="h@i.j"))),
        ("invite", repr(Invite(email="c@d.e"))),  # added by send_email's helpers.add_job
    }
    threads = {task: thread for task, _, thread in calls}
    assert threads["send_email"] == threading.current_thread().name  # on the event loop
    assert threads["resize"].startswith(TASK_THREAD_PREFIX)  # a plain def: in a task thread
    assert threads["invite"].startswith(TASK_THREAD_PREFIX)
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


SEND_EMAIL_FILE = """
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from worker_cli import Helpers


@dataclass
class Item:
    sku: str
    qty: int


@dataclass
class SendEmail:
    IDENTIFIER: ClassVar[str] = "send_email"
    to: str
    items: list[Item]


async def task(payload: SendEmail, helpers: Helpers) -> None:
    assert isinstance(payload, SendEmail) and all(isinstance(i, Item) for i in payload.items)
    seen = Path(__file__).parent / "seen.jsonl"
    with seen.open("a") as out:
        out.write(json.dumps(["send_email", payload.to, [i.qty for i in payload.items]]) + "\\n")
"""

RESIZE_FILE = """
from __future__ import annotations

import json
from pathlib import Path
from typing import NotRequired, TypedDict


class Resize(TypedDict):
    image: int
    sizes: NotRequired[list[int]]


def task(payload: Resize, helpers) -> None:
    seen = Path(__file__).parent / "seen.jsonl"
    with seen.open("a") as out:
        out.write(json.dumps(["resize", payload]) + "\\n")
"""

INVITE_FILE = """
from __future__ import annotations

import json
from pathlib import Path

import pydantic


class Invite(pydantic.BaseModel):
    email: str


async def task(payload: Invite, helpers) -> None:
    seen = Path(__file__).parent / "seen.jsonl"
    with seen.open("a") as out:
        out.write(json.dumps(["invite", type(payload).__name__, payload.email]) + "\\n")
"""


async def test_a_task_folder_with_string_annotations_and_jobs_from_sql(
    db: str, tmp_path: Path
) -> None:
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "send_email.py").write_text(SEND_EMAIL_FILE)
    (tasks / "resize.py").write_text(RESIZE_FILE)
    (tasks / "invite.py").write_text(INVITE_FILE)
    # As a Node service or a trigger would add them, with keys the types do not declare.
    rows(
        db,
        """
        select graphile_worker.add_job('send_email',
          '{"to": "a@b.c", "items": [{"sku": "x", "qty": 3, "price": 1.5}], "lang": "fr"}');
        select graphile_worker.add_job('resize', '{"image": 9, "format": "webp"}');
        select graphile_worker.add_job('invite', '{"email": "e@f.g"}');
        """,
    )
    await run_once(db, task_directory=tasks, no_handle_signals=True)
    seen = sorted(json.loads(line) for line in (tasks / "seen.jsonl").read_text().splitlines())
    assert seen == [
        ["invite", "Invite", "e@f.g"],
        ["resize", {"image": 9}],
        ["send_email", "a@b.c", [3]],
    ]
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


@dataclass
class Order:
    items: list[Item]


def order(payload: Order, helpers: Helpers) -> None:
    record("order", payload)


def now() -> datetime:
    return datetime.now(UTC)


def job_row(db: str, job_id: int) -> dict[str, Any]:
    [row] = rows(
        db,
        "select attempts, max_attempts, last_error, locked_by from graphile_worker.jobs"
        " where id = %s",
        [job_id],
    )
    return row


async def test_a_payload_that_does_not_fit_fails_for_good_until_rescheduled(
    utils: WorkerUtils, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    tasks = {**TASKS, "order": order}
    no_to = await utils.add_job("send_email", {"subject": "hi"})
    bad_qty = await utils.add_job(
        "order",
        {"items": [{"sku": "a", "qty": 1}, {"sku": "b", "qty": 1}, {"sku": "c", "qty": "2"}]},
        job_key="order-1",
    )
    fine = await utils.add_job(SendEmail(to="ok@b.c"))
    events = Events()
    failed: list[int] = []
    events.on("job:failed", lambda data: failed.append(data["job"].id))
    caplog.set_level(logging.INFO, logger="graphile_worker")

    await run_once(db, task_list=tasks, events=events, no_handle_signals=True)

    assert [(task, repr(payload)) for task, payload, _ in calls] == [
        ("send_email", repr(SendEmail(to="ok@b.c")))
    ]
    assert job_row(db, no_to.id) == {
        "attempts": 25,
        "max_attempts": 25,
        "last_error": "PayloadError: payload.to: missing",
        "locked_by": None,
    }
    assert job_row(db, bad_qty.id)["attempts"] == 25
    assert job_row(db, bad_qty.id)["last_error"] == (
        "PayloadError: payload.items[2].qty: expected int, got str"
    )
    assert value(db, "select count(*) from graphile_worker.jobs where id = %s", [fine.id]) == 0
    assert sorted(failed) == sorted([no_to.id, bad_qty.id])
    [line] = [r for r in caplog.records if f"Failed task {no_to.id} " in r.getMessage()]
    assert line.getMessage().endswith(
        "attempt 1/25) with error 'PayloadError: payload.to: missing'; the payload does not "
        "fit the task: failed permanently (no retry)"
    )
    assert line.exc_info is None  # a user error: no traceback

    # Due again, but not retried: the same payload cannot fit.
    rows(db, "update graphile_worker._private_jobs set run_at = now() - interval '1 minute'")
    await run_once(db, task_list=tasks, no_handle_signals=True)
    assert len(calls) == 1
    assert job_row(db, no_to.id)["attempts"] == 25

    # Fixed in SQL, then revived.
    rows(
        db,
        'update graphile_worker._private_jobs set payload = \'{"to": "fixed@b.c"}\' where id = %s',
        [no_to.id],
    )
    # Revived, then fixed by replacing the job through its job_key.
    revived = await utils.reschedule_jobs([no_to.id, bad_qty.id], attempts=0, run_at=now())
    assert sorted(job.id for job in revived) == sorted([no_to.id, bad_qty.id])
    replaced = await utils.add_job("order", Order([Item("c", 2)]), job_key="order-1")
    assert replaced.id == bad_qty.id

    await run_once(db, task_list=tasks, no_handle_signals=True)
    assert sorted((task, repr(payload)) for task, payload, _ in calls[1:]) == [
        ("order", repr(Order([Item("c", 2)]))),
        ("send_email", repr(SendEmail(to="fixed@b.c"))),
    ]
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0


async def test_add_job_writes_the_json_a_node_task_reads(utils: WorkerUtils, db: str) -> None:
    await utils.add_job(SendEmail(to="a@b.c", items=[Item("x", 2)]), queue_name="mail")
    await utils.add_job(Invite(email="e@f.g", replyTo="h@i.j"))
    await utils.add_jobs(
        [
            {"payload": SendEmail(to="k@l.m"), "priority": -1},
            {"identifier": "resize", "payload": Resize(image=1, sizes=[])},
        ]
    )
    found = rows(
        db,
        "select t.identifier as task_identifier, q.queue_name, j.priority,"
        " j.payload::text as json from graphile_worker._private_jobs j"
        " join graphile_worker._private_tasks t on t.id = j.task_id"
        " left join graphile_worker._private_job_queues q on q.id = j.job_queue_id"
        " order by j.id",
    )
    assert [
        (row["task_identifier"], row["queue_name"], row["priority"], json.loads(row["json"]))
        for row in found
    ] == [
        (
            "send_email",
            "mail",
            0,
            {"to": "a@b.c", "items": [{"sku": "x", "qty": 2}], "cc": None},
        ),
        ("invite", None, 0, {"email": "e@f.g", "replyTo": "h@i.j"}),
        ("send_email", None, -1, {"to": "k@l.m", "items": [], "cc": None}),
        ("resize", None, 0, {"image": 1, "sizes": []}),
    ]


def test_the_sync_utilities_take_instances_too(db: str) -> None:
    with make_sync_worker_utils(db) as sync_utils:
        job = sync_utils.add_job(SendEmail(to="s@y.nc"), priority=3)
        [batch] = sync_utils.add_jobs([{"payload": Invite(email="b@a.tch")}])
    assert (job.task_identifier, job.priority, job.payload["to"]) == ("send_email", 3, "s@y.nc")
    assert (batch.task_identifier, batch.payload) == (
        "invite",
        {"email": "b@a.tch", "replyTo": None},
    )


async def test_unique_keys_compare_fields_of_an_instance(utils: WorkerUtils, db: str) -> None:
    rule = UniqueRule(period=600, keys=["to"])
    first = await utils.add_job(SendEmail(to="a@b.c"), unique=rule)
    again = await utils.add_job(SendEmail(to="a@b.c", cc="x"), unique=rule)
    named = await utils.add_job("send_email", SendEmail(to="a@b.c", cc="y"), unique=rule)
    [batch, other] = await utils.add_jobs(
        [{"payload": SendEmail(to="a@b.c")}, {"payload": SendEmail(to="z@b.c")}], unique=rule
    )
    assert not first.conflict and not other.conflict
    assert all(r.conflict and r.job_id == first.job_id for r in (again, named, batch))


async def test_an_identifier_the_payload_class_contradicts_adds_nothing(
    utils: WorkerUtils, db: str
) -> None:
    with pytest.raises(JobSpecError, match=r"^identifier: is 'resize', but the payload is a"):
        await utils.add_job("resize", SendEmail(to="a@b.c"))
    with pytest.raises(JobSpecError, match=r"^specs\[1\]\.identifier: is 'resize', but the"):
        await utils.add_jobs(
            [
                {"payload": SendEmail(to="a@b.c")},
                {"identifier": "resize", "payload": SendEmail(to="a@b.c")},
            ]
        )
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
