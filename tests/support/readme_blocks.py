"""The documentation's code blocks and transcripts (the pages under docs/),
for the tests that run them as written, in the environment a user has."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from dbhelpers import cli_path

#: The folder of this Python's scripts (graphile-worker among them).
BIN = str(Path(sys.executable).parent)
ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def pages() -> dict[str, str]:
    """Every page of the docs, by its path below docs/ (``guides/tasks.md``)."""
    return {
        path.relative_to(DOCS).as_posix(): path.read_text(encoding="utf-8")
        for path in sorted(DOCS.rglob("*.md"))
    }


def headings(text: str) -> list[tuple[int, int, str]]:
    """``(line, level, title)`` of each heading of ``text``, outside code blocks."""
    found = []
    fenced = False
    for number, line in enumerate(text.splitlines()):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"(#+) (.*)", line)):
            found.append((number, len(match.group(1)), match.group(2)))
    return found


def section(heading: str) -> str:
    """The text under ``heading`` (its title, with or without the ``#``s: the
    pages' levels differ), on whichever page has it, up to the next heading of
    its level or above. A title must be on exactly one page, once."""
    title = heading.lstrip("#").strip()
    found = [
        (text, number, level, marks)
        for text in pages().values()
        for marks in [headings(text)]
        for number, level, name in marks
        if name == title
    ]
    assert len(found) == 1, f"{title!r} is a heading {len(found)} times in docs/, not once"
    [(text, number, level, marks)] = found
    lines = text.splitlines()
    end = next((n for n, lv, _ in marks if n > number and lv <= level), len(lines))
    return "\n".join(lines[number:end]) + "\n"


def blocks(heading: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section(heading), flags=re.S)


def write_files(heading: str, directory: Path) -> dict[str, Path]:
    """Write the section's ``# path`` Python blocks under ``directory``."""
    written = {}
    for block in blocks(heading, "python"):
        first = block.splitlines()[0]
        if re.fullmatch(r"# [\w/]+\.py", first):
            path = directory / first[2:]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block, encoding="utf-8")
            written[first[2:]] = path
    return written


def app_env(db: str) -> dict[str, str]:
    """The environment a user has: this venv first on PATH, DATABASE_URL set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env.update(DATABASE_URL=db, PATH=BIN + os.pathsep + env.get("PATH", ""))
    return env


def run_transcript(heading: str, db: str, directory: Path) -> tuple[list[str], list[str]]:
    """Run the section's first ``text`` transcript in ``directory`` (its files
    written there first): each ``$ python ...`` and ``$ graphile-worker ...``
    line as a user would, which must succeed. Returns the Python commands'
    outputs and the transcript's output lines, to compare."""
    write_files(heading, directory)
    transcript = blocks(heading, "text")[0]  # the first (others show the command line)
    env = app_env(db)
    outputs: list[str] = []
    expected: list[str] = []
    for line in transcript.splitlines():
        if not line.startswith("$ "):
            expected.append(line)
            continue
        command = shlex.split(line.removeprefix("$ "))
        command = [sys.executable, *command[1:]] if command[0] == "python" else command
        command = [cli_path(), *command[1:]] if command[0] == "graphile-worker" else command
        done = subprocess.run(
            command, cwd=directory, env=env, capture_output=True, text=True, timeout=60,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, (line, done.stderr)
        if command[0] == sys.executable:
            outputs.extend(done.stdout.strip().splitlines())
    return outputs, expected
