"""The blocking twins are generated, never kept by hand (issue 42).

``tools/async_to_sync.py`` writes each sync module from its asyncio source
(``sync_worker_utils.py`` from ``worker_utils.py``, ``sync_waiting.py`` from
``async_waiting.py``). Here: every checked-in twin is what the generator
writes now (run ``python tools/async_to_sync.py`` after editing a source), a
hand edit of a twin is caught, and the transformation's rules hold.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _tool() -> ModuleType:
    spec = importlib.util.spec_from_file_location("async_to_sync", ROOT / "tools/async_to_sync.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


tool = _tool()


@pytest.mark.parametrize("twin", tool.GENERATED, ids=lambda twin: twin.target)
def test_the_checked_in_twin_is_current(twin: Any) -> None:
    assert tool.stale(ROOT, (twin,)) == [], (
        f"{twin.target} is not what `{tool.COMMAND}` writes from {twin.source}: "
        "run it (and never edit the generated file)"
    )


def test_a_hand_edited_twin_is_caught(tmp_path: Path) -> None:
    twin = tool.GENERATED[0]
    for name in (twin.source, twin.target):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    assert tool.stale(tmp_path, (twin,)) == []
    target = tmp_path / twin.target
    target.write_text(target.read_text().replace("return self._run(", "return  self._run(", 1))
    assert tool.stale(tmp_path, (twin,)) == [twin.target]


def test_the_check_command_passes_on_the_tree(capsys: pytest.CaptureFixture[str]) -> None:
    assert tool.main(["--check"]) == 0, capsys.readouterr().err


SOURCE = '''\
import asyncio  # async-only
from contextlib import asynccontextmanager


class Utils:
    """Use ``async with make_utils() as u: await u.go()``; the asyncio task waits."""

    # sync-only: lock = threading.Lock()
    @asynccontextmanager
    async def go(self) -> AsyncIterator[None]:
        await asyncio.sleep(1)  # noqa: ASYNC110
        async for item in self.items():  # sync: for item in self.blocking_items():
            pass
        # async-only: begin
        await self.flush()
        # async-only: end
        return self.connect(Utils)
'''

EXPECTED = '''\
from contextlib import contextmanager


class SyncUtils:
    """Use ``with make_sync_utils() as u: u.go()``; the thread waits."""

    lock = threading.Lock()
    @contextmanager
    def go(self) -> Iterator[None]:
        time.sleep(1)
        for item in self.blocking_items():
            pass
        return self.connect(SyncUtils)
'''


def test_the_transformation_rules() -> None:
    names = {
        **tool.DEFAULT_NAMES,
        "Utils": "SyncUtils",
        "make_utils": "make_sync_utils",
        "connect": "connect_sync",
    }
    marked = tool.apply_markers(SOURCE, "example.py")
    assert tool.transform(marked, names, {"asyncio task": "thread"}) == EXPECTED


def test_unbalanced_markers_are_refused() -> None:
    with pytest.raises(tool.MarkerError, match="without an end"):
        tool.apply_markers("# async-only: begin\nx = 1\n", "example.py")
    with pytest.raises(tool.MarkerError, match="without a begin"):
        tool.apply_markers("x = 1\n# async-only: end\n", "example.py")
