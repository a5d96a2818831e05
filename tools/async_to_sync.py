"""Write the blocking twins of the package's asyncio modules: no hand-kept copy.

Each generated module (``GENERATED`` below) is its asyncio source with:

- ``async`` dropped before ``def``, ``with`` and ``for``, and every ``await``
  dropped (in docstrings and comments too, where they show code);
- the names of the file's mapping renamed (``DEFAULT_NAMES``, then the file's
  own ``names``): a plain name (``WorkerUtils``, ``AsyncIterator``) wherever it
  stands on its own, in the code and in strings and comments (there only a
  name with a capital or an underscore: "connect" stays a word), but not after a
  dot (``worker_cli.client.worker_utils.WorkerUtils`` still names the async
  class, and ``self.connection`` is an attribute); a dotted name
  (``asyncio.sleep``) wherever it is written so;
- the file's ``text`` replacements made in strings and comments only (prose:
  "asyncio task" -> "thread");
- ``# noqa: ASYNC...`` comments dropped (no asyncio rule applies to the twin);
- the markers below applied;
- a header saying it is generated; then ``ruff check --select I,F401 --fix``
  (the imports sorted again after the renames, and those the twin does not use
  dropped) and ``ruff format``.

Markers, comments in the asyncio source where the twin has no mechanical form:

``<code>  # sync: <other code>``
    the line is ``<other code>`` in the twin (same indentation);
``<code>  # async-only``
    the line is left out of the twin;
``# sync-only: <code>`` (a comment line)
    the line is ``<code>`` in the twin, at the comment's indentation (text after
    ``sync-only: `` keeps its own leading spaces, for nested lines);
``# async-only: begin`` ... ``# async-only: end``
    the lines between (and the markers) are left out of the twin.

Use::

    python tools/async_to_sync.py            # write every twin
    python tools/async_to_sync.py --check    # exit 1, naming each twin not current

ruff is found next to the running Python, else run as ``python -m ruff``.
Standard library only, besides ruff.
"""

from __future__ import annotations

import argparse
import io
import itertools
import re
import subprocess
import sys
import tokenize
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COMMAND = "python tools/async_to_sync.py"

#: Renames every file gets.
DEFAULT_NAMES: dict[str, str] = {
    "AbstractAsyncContextManager": "AbstractContextManager",
    "AsyncConnection": "Connection",
    "AsyncConnectionPool": "ConnectionPool",
    "AsyncGenerator": "Generator",
    "AsyncIterator": "Iterator",
    "asynccontextmanager": "contextmanager",
    "__aenter__": "__enter__",
    "__aexit__": "__exit__",
    "__aiter__": "__iter__",
    "__anext__": "__next__",
    "psycopg.AsyncConnection": "psycopg.Connection",
    "asyncio.sleep": "time.sleep",
    "asyncio.Lock": "threading.Lock",
    "asyncio.Event": "threading.Event",
}


@dataclass(frozen=True)
class Twin:
    """One generated module: its asyncio source, and what changes."""

    source: str
    target: str
    names: dict[str, str] = field(default_factory=dict)
    text: dict[str, str] = field(default_factory=dict)


GENERATED: tuple[Twin, ...] = (
    Twin(
        "worker_cli/client/worker_utils.py",
        "worker_cli/client/sync_worker_utils.py",
        names={
            "WorkerUtils": "SyncWorkerUtils",
            "make_worker_utils": "make_sync_worker_utils",
            "quick_add_job": "quick_add_job_sync",
            "check_connection": "check_connection_sync",
            "connect": "connect_sync",
            "autocommit_mode_async": "autocommit_mode",
            "run_plan_async": "run_plan",
            "AsyncWaitListener": "SyncWaitListener",
            "wait_async": "wait_blocking",
            "held_connection.holding_connection": "held_connection.sync_holding_connection",
            "held_connection.lent_connection": "held_connection.sync_lent_connection",
            "held_connection.pool_connection": "held_connection.sync_pool_connection",
        },
        text={
            "asyncio task": "thread",
            "graphile-worker-utils": "graphile-worker-sync-utils",
        },
    ),
    Twin(
        "worker_cli/client/async_waiting.py",
        "worker_cli/client/sync_waiting.py",
        names={
            "WorkerUtils": "SyncWorkerUtils",
            "autocommit_mode_async": "autocommit_mode",
            "run_plan_async": "run_plan",
            "AsyncWaitListener": "SyncWaitListener",
            "wait_async": "wait_blocking",
        },
        text={" on asyncio": ", blocking"},
    ),
)

_MARK_SYNC = re.compile(r"#\s*sync:\s?(?P<code>.*)$")
_MARK_SYNC_ONLY = re.compile(r"#\s*sync-only:\s?(?P<code>.*)$")
_MARK_ASYNC_ONLY = re.compile(r"#\s*async-only\s*$")
_MARK_BEGIN = re.compile(r"#\s*async-only:\s*begin\s*$")
_MARK_END = re.compile(r"#\s*async-only:\s*end\s*$")
_NOQA_ASYNC = re.compile(r"#\s*noqa:\s*ASYNC\d+.*$")


_ASYNC_OF = ("def", "with", "for")


class MarkerError(ValueError):
    """A marker the generator cannot apply (unbalanced, misplaced)."""


def _comments(text: str) -> dict[int, tuple[int, str, int | None]]:
    """The comment of each line that has one: line number (1-based) to
    (column, text, the line where the statement it ends began; None for a
    comment that ends no statement: alone on its line, or inside brackets)."""
    found = {}
    statement: int | None = None
    tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    for tok, after in itertools.pairwise(tokens):
        if tok.type == tokenize.COMMENT:
            ends = after.type == tokenize.NEWLINE
            found[tok.start[0]] = (tok.start[1], tok.string, statement if ends else None)
        elif tok.type == tokenize.NEWLINE:
            statement = None
        elif tok.type not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT) and statement is None:
            statement = tok.start[0]
    return found


def apply_markers(text: str, path: str) -> str:
    """The source with its markers applied (see the module's docstring). A
    ``# sync:`` or ``# async-only`` marker after a statement written on
    several lines (as ruff formats a long import) stands for all of them."""
    comments = _comments(text)
    lines: list[str | None] = list(text.splitlines(keepends=True))
    skipping = False
    for number in range(1, len(lines) + 1):
        line = lines[number - 1]
        assert line is not None
        col, comment, statement = comments.get(number, (-1, "", None))
        code_before = bool(line[:col].strip()) if col >= 0 else True
        if comment and _MARK_BEGIN.match(comment):
            if skipping or code_before:
                raise MarkerError(f"{path}:{number}: misplaced 'async-only: begin'")
            skipping = True
            lines[number - 1] = None
            continue
        if comment and _MARK_END.match(comment):
            if not skipping or code_before:
                raise MarkerError(f"{path}:{number}: 'async-only: end' without a begin")
            skipping = False
            lines[number - 1] = None
            continue
        if skipping:
            lines[number - 1] = None
            continue
        if not comment:
            continue
        first = statement if statement is not None else number
        indent_line = lines[first - 1] or ""
        indent = indent_line[: len(indent_line) - len(indent_line.lstrip())]
        if (match := _MARK_SYNC_ONLY.match(comment)) and not code_before:
            lines[number - 1] = f"{line[:col]}{match['code']}\n"
        elif (match := _MARK_SYNC.match(comment)) and code_before:
            lines[first - 1 : number] = [None] * (number - first + 1)
            lines[number - 1] = f"{indent}{match['code']}\n"
        elif _MARK_ASYNC_ONLY.match(comment) and code_before:
            lines[first - 1 : number] = [None] * (number - first + 1)
        elif _MARK_SYNC.match(comment) or _MARK_ASYNC_ONLY.match(comment):
            raise MarkerError(f"{path}:{number}: marker {comment!r} needs code before it")
    if skipping:
        raise MarkerError(f"{path}: 'async-only: begin' without an end")
    return "".join(line for line in lines if line is not None)


def _prose(text: str, names: dict[str, str], phrases: dict[str, str]) -> str:
    """A string's or comment's text in the twin."""
    text = re.sub(r"\basync (?=(def|with|for)\b)", "", text)
    text = re.sub(r"\bawait ", "", text)
    for old, new in phrases.items():
        text = text.replace(old, new)
    for old, new in names.items():
        if old.islower() and "_" not in old and "." not in old:
            continue  # a plain word ("connect") in prose stays a word
        text = re.sub(rf"(?<![\w.]){re.escape(old)}\b", new, text)
    return text


def transform(text: str, names: dict[str, str], phrases: dict[str, str]) -> str:
    """The token-level changes: ``async``/``await`` dropped, names renamed,
    prose in strings and comments adjusted; comments and layout kept."""
    plain = {old: new for old, new in names.items() if "." not in old}
    dotted = {tuple(old.split(".")): new for old, new in names.items() if "." in old}
    lines = text.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))

    def offset(pos: tuple[int, int]) -> int:
        return starts[pos[0] - 1] + pos[1]

    tokens = [
        tok
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT)
    ]
    edits: list[tuple[int, int, str]] = []  # (start, end, replacement)
    index = 0
    while index < len(tokens):
        tok = tokens[index]
        after = tokens[index + 1] if index + 1 < len(tokens) else None
        before = tokens[index - 1] if index else None
        if (
            tok.type == tokenize.NAME
            and after is not None
            and (tok.string == "await" or (tok.string == "async" and after.string in _ASYNC_OF))
        ):
            # Drop the keyword and the space after it.
            edits.append((offset(tok.start), offset(after.start), ""))
            index += 1
            continue
        if tok.type == tokenize.NAME and (before is None or before.string != "."):
            matched = False
            for parts, new in dotted.items():
                window = tokens[index : index + 2 * len(parts) - 1]
                if [t.string for t in window] == list(_dotted(parts)):
                    edits.append((offset(tok.start), offset(window[-1].end), new))
                    index += len(window)
                    matched = True
                    break
            if matched:
                continue
            if tok.string in plain:
                edits.append((offset(tok.start), offset(tok.end), plain[tok.string]))
        elif tok.type == tokenize.STRING:
            new_text = _prose(tok.string, names, phrases)
            if new_text != tok.string:
                edits.append((offset(tok.start), offset(tok.end), new_text))
        elif tok.type == tokenize.COMMENT:
            new_text = _NOQA_ASYNC.sub("", tok.string).rstrip()
            new_text = _prose(new_text, names, phrases)
            if new_text != tok.string:
                start = offset(tok.start)
                if not new_text:  # a dropped noqa: the spaces before it too
                    start = len(text[:start].rstrip(" "))
                edits.append((start, offset(tok.end), new_text))
        index += 1
    for start, end, replacement in sorted(edits, reverse=True):
        text = text[:start] + replacement + text[end:]
    return text


def _dotted(parts: tuple[str, ...]) -> list[str]:
    out: list[str] = []
    for part in parts:
        if out:
            out.append(".")
        out.append(part)
    return out


def header(twin: Twin) -> str:
    """The generated file's first lines."""
    return (
        f"# GENERATED by `{COMMAND}` from {twin.source}:\n"
        f"# do not edit; edit that file and run the command again.\n"
    )


def _ruff() -> list[str]:
    beside = Path(sys.executable).parent / "ruff"
    return [str(beside)] if beside.exists() else [sys.executable, "-m", "ruff"]


def _ruff_run(args: list[str], text: str, filename: str) -> str:
    done = subprocess.run(
        [*_ruff(), *args, "--stdin-filename", filename, "-"],
        input=text,
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"ruff {' '.join(args)} failed on {filename}:\n{done.stderr}")
    return done.stdout


def generate(twin: Twin, root: Path = ROOT) -> str:
    """The text ``twin.target`` must have."""
    source = (root / twin.source).read_text()
    names = {**DEFAULT_NAMES, **twin.names}
    text = transform(apply_markers(source, twin.source), names, twin.text)
    text = header(twin) + text
    text = _ruff_run(["check", "--select", "I,F401", "--fix", "--quiet"], text, twin.target)
    return _ruff_run(["format", "--quiet"], text, twin.target)


def stale(root: Path = ROOT, twins: tuple[Twin, ...] = GENERATED) -> list[str]:
    """The targets whose checked-in text is not what the generator writes."""
    found = []
    for twin in twins:
        target = root / twin.target
        if not target.exists() or target.read_text() != generate(twin, root):
            found.append(twin.target)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="write nothing; exit 1 if a twin is not current"
    )
    args = parser.parse_args(argv)
    if args.check:
        names = stale()
        for name in names:
            print(f"{name} is not current: run `{COMMAND}`", file=sys.stderr)
        return 1 if names else 0
    for twin in GENERATED:
        target = ROOT / twin.target
        text = generate(twin)
        if not target.exists() or target.read_text() != text:
            target.write_text(text)
            print(f"wrote {twin.target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
