"""The "Try it" section of the guide "Progress and job logs" runs as written:
its task file, then its commands as a user types them; the outputs it shows
are the commands' own (``...`` stands for times and what follows them)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from readme_blocks import app_env

pytestmark = pytest.mark.db

ROOT = Path(__file__).resolve().parents[2]


def section(title: str) -> str:
    text = (ROOT / "docs" / "guides" / "progress-and-logs.md").read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def matches(shown: str, expected: str) -> bool:
    """A line of the output against a line of the README (``...`` matches anything)."""
    pattern = ".*".join(re.escape(part) for part in expected.split("..."))
    return re.fullmatch(pattern, shown) is not None


def test_the_guides_transcript_runs_as_written(db: str, tmp_path: Path) -> None:
    text = section("Try it")
    [task] = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    path = tmp_path / task.splitlines()[0].removeprefix("# ")
    path.parent.mkdir(parents=True)
    path.write_text(task, encoding="utf-8")
    [commands] = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    outputs = []
    for command in commands.strip().splitlines():
        done = subprocess.run(
            ["bash", "-e", "-c", command],
            cwd=tmp_path,
            env=app_env(db),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, (command, done.stderr)
        outputs.append(done.stdout)
    job, schedules = re.findall(r"```text\n(.*?)```", text, flags=re.S)
    shown_job = outputs[2].splitlines()
    expected_job = job.splitlines()
    head = [line for line in expected_job[: expected_job.index("...")]]
    assert all(matches(s, e) for s, e in zip(shown_job, head, strict=False)), shown_job
    tail = expected_job[expected_job.index("...") + 1 :]
    assert all(matches(s, e) for s, e in zip(shown_job[-len(tail) :], tail, strict=True)), shown_job
    shown_schedules = outputs[4].splitlines()
    expected_schedules = schedules.splitlines()
    assert shown_schedules[0].split() == expected_schedules[0].split()
    assert matches(" ".join(shown_schedules[1].split()), " ".join(expected_schedules[1].split()))
