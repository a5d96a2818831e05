"""mypy --strict sees typed payloads: a typed task, its payload classes and the
add_job calls check; wrong payloads are rejected, each on the line marked."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

PAYLOADS = """
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, TypedDict

import pydantic


@dataclass
class Item:
    sku: str
    qty: int


@dataclass
class SendEmail:
    IDENTIFIER: ClassVar[str] = "send_email"
    to: str
    items: list[Item] = field(default_factory=list)


class Invite(pydantic.BaseModel):
    IDENTIFIER: ClassVar[str] = "invite"
    email: str


class Resize(TypedDict):
    image: int


@dataclass
class Unnamed:
    x: int
"""

TASK = """
from __future__ import annotations

from typing import TYPE_CHECKING

from payloads import Invite, SendEmail

if TYPE_CHECKING:
    from worker_cli import Helpers


async def task(payload: SendEmail, helpers: Helpers) -> None:
    total: int = sum(item.qty for item in payload.items)
    helpers.logger.info("%s: %d", payload.to.upper(), total)
    await helpers.add_job(Invite(email=payload.to))
"""

GOOD = """
from __future__ import annotations

from typing import Any

from payloads import Invite, Item, Resize, SendEmail
from send_email import task as send_email
from worker_cli import (
    Helpers,
    Job,
    TypedTaskFunction,
    UniqueJobResult,
    UniqueRule,
    WorkerUtils,
    make_sync_worker_utils,
    quick_add_job,
    quick_add_job_sync,
    run_once,
    typed_task_list,
)


def invite(payload: Invite, helpers: Helpers) -> None:
    print(payload.email)


def resize(payload: Resize, helpers: Helpers) -> None:
    print(payload["image"] + 1)


async def main(utils: WorkerUtils) -> None:
    job: Job = await utils.add_job(SendEmail(to="a@b.c", items=[Item("x", 1)]))
    unique: UniqueJobResult = await utils.add_job(
        Invite(email="a@b.c"), unique=UniqueRule(period=60), queue_name="mail"
    )
    raw: Job = await utils.add_job("resize", Resize(image=1), priority=1)
    legacy: Job = await utils.add_job("send_email", {"to": "a@b.c"})
    print(job.id, unique.conflict, raw.id, legacy.id)
    quick: Job = await quick_add_job(SendEmail(to="q@b.c"), priority=2)
    with make_sync_worker_utils() as sync_utils:
        synced: Job = sync_utils.add_job(Invite(email="s@b.c"))
    blocking: Job = quick_add_job_sync(Invite(email="q@b.c"))
    print(quick.id, synced.id, blocking.id)
    handler: TypedTaskFunction[SendEmail] = send_email
    tasks: dict[str, Any] = {**typed_task_list(handler, invite), "resize": resize}
    await run_once(task_list=tasks)
"""

BAD = """
from __future__ import annotations

from typing import Any

from payloads import Invite, SendEmail, Unnamed
from worker_cli import Helpers, Job, UniqueJobResult, WorkerUtils, typed_task_list


def untyped(payload: dict[str, Any], helpers: Helpers) -> None:
    pass


def unnamed(payload: Unnamed, helpers: Helpers) -> None:
    pass


async def wrong(payload: SendEmail, helpers: Helpers) -> None:
    print(payload.subject)  # E: attr-defined
    await helpers.add_job(Unnamed(x=1))  # E: call-overload


async def main(utils: WorkerUtils) -> None:
    await utils.add_job(SendEmail(to=1))  # E: arg-type
    await utils.add_job(Unnamed(x=1))  # E: call-overload
    await utils.add_job(SendEmail(to="a"), {"to": "b"})  # E: call-overload
    await utils.add_job(42)  # E: call-overload
    await utils.add_job(SendEmail(to="a"), priority="high")  # E: call-overload
    wrong_type: UniqueJobResult = await utils.add_job(Invite(email="a"))  # E: assignment
    right_type: Job = await utils.add_job(Invite(email="a"))
    print(wrong_type, right_type)
    typed_task_list(untyped)  # E: type-var
    typed_task_list(unnamed)  # E: type-var
"""


def mypy(directory: Path, *files: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--cache-dir",
            str(directory / ".cache"),
            *files,
        ],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_typed_payloads_check_under_mypy_strict_and_wrong_ones_are_rejected(
    tmp_path: Path,
) -> None:
    (tmp_path / "payloads.py").write_text(PAYLOADS)
    (tmp_path / "send_email.py").write_text(TASK)
    (tmp_path / "good.py").write_text(GOOD)
    (tmp_path / "bad.py").write_text(BAD)

    checked = mypy(tmp_path, "payloads.py", "send_email.py", "good.py", "bad.py")

    reported = {
        (match["file"], int(match["line"]), match["code"])
        for match in re.finditer(
            r"^(?P<file>[\w.]+):(?P<line>\d+): error: .*\[(?P<code>[\w-]+)\]$",
            checked.stdout,
            re.MULTILINE,
        )
    }
    expected = {
        ("bad.py", number, marker.split("# E: ")[1])
        for number, marker in enumerate(BAD.splitlines(), 1)
        if "# E: " in marker
    }
    assert reported == expected, checked.stdout + checked.stderr
