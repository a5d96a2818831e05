"""The docs' flag tables and ``graphile-worker --help`` agree.

Options come from the click command itself (what ``--help`` prints) and are
checked against the table under "The worker's options" (the worker, in
docs/reference/options.md) and under each command's heading in the guides
(``graphile-worker jobs``, ...): the same flags, the same variables.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import click
import pytest
from dbhelpers import run_cli
from readme_blocks import section

import worker_cli
from worker_cli.cli.commands import command

pytestmark = pytest.mark.unit


SOURCE = "\n".join(
    p.read_text(encoding="utf-8") for p in Path(worker_cli.__file__).parent.rglob("*.py")
)

Row = tuple[frozenset[str], frozenset[str]]  # (flags, environment variables)

#: The worker's table, and the headings of the commands whose section is not
#: named after the command.
WORKER = "The worker's options"
HEADINGS = {"dashboard": "Dashboard", "cancel": "Cancelling a job"}


def docs_table(heading: str) -> list[Row]:
    """The ``| flag | environment | ...`` table under ``heading``."""
    lines = section(heading).splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| flag | environment |"))
    table = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        flag_cell, env_cell = line.split("|")[1:3]
        flags = frozenset(
            part.strip().split()[0]
            for code in re.findall(r"`([^`]*)`", flag_cell)
            for part in code.split(",")
            if part.strip().startswith("-")
        )
        envvars = frozenset(re.findall(r"`([A-Z][A-Z0-9_]*)`", env_cell))
        table.append((flags, envvars))
    return table


def click_options(cmd: click.Command) -> list[Row]:
    """The visible options of ``cmd`` (with -h/--help), as rows of the docs."""
    ctx = click.Context(cmd, info_name="graphile-worker", **cmd.context_settings)
    options = []
    for param in cmd.get_params(ctx):
        if not isinstance(param, click.Option) or param.hidden:
            continue
        envvar = param.envvar
        envvars = [] if envvar is None else [envvar] if isinstance(envvar, str) else list(envvar)
        options.append((frozenset(param.opts + param.secondary_opts), frozenset(envvars)))
    return options


def help_flags(help_text: str) -> set[str]:
    """The flags listed under "Options:" in ``--help`` output."""
    options = help_text.split("Options:", 1)[1].split("Commands:", 1)[0]
    return {
        part.strip().split()[0]
        for match in re.finditer(r"^  (-\S.*?)(?:\s{2,}|$)", options, re.MULTILINE)
        for part in match.group(1).split(", ")
    }


def check(options: Iterable[Row], table: list[Row]) -> None:
    row_of = {flag: row for row in table for flag in row[0]}
    options = list(options)
    documented = set(row_of)
    offered = {flag for flags, _ in options for flag in flags}
    assert offered - documented == set(), "options missing from the docs' table"
    assert documented - offered == set(), "rows in the docs for options that do not exist"
    for flags, envvars in options:
        rows = {row_of[flag] for flag in flags}
        assert len(rows) == 1, f"{sorted(flags)} are split over rows of the docs"
        [(_, documented_envvars)] = rows
        assert documented_envvars == envvars, f"{sorted(flags)}: environment variables differ"


COMMANDS = [pytest.param((), WORKER, id="worker")] + [
    pytest.param((name,), HEADINGS.get(name, f"`graphile-worker {name}`"), id=name)
    for name in command.commands
]


@pytest.mark.parametrize("args,heading", COMMANDS)
def test_docs_table_matches_the_options(args: tuple[str, ...], heading: str) -> None:
    cmd: click.Command = command
    for name in args:
        assert isinstance(cmd, click.Group)
        cmd = cmd.commands[name]
    table = docs_table(heading)
    options = click_options(cmd)
    check(options, table)
    # And --help, as printed, lists exactly those options.
    result = run_cli(*args, "--help")
    assert result.returncode == 0, result.stderr
    assert help_flags(result.stdout) == {flag for flags, _ in options for flag in flags}


def test_environment_only_rows_name_variables_the_code_reads() -> None:
    for flags, envvars in docs_table(WORKER):
        if not flags:
            assert envvars, "a row of the docs with neither a flag nor a variable"
            for name in envvars:
                assert f'"{name}"' in SOURCE, f"{name} is documented but never read"


def test_the_check_catches_disagreements() -> None:
    """A missing row, an extra row and a different variable are all reported."""
    options: list[Row] = [
        (frozenset({"-s", "--schema"}), frozenset({"GRAPHILE_WORKER_SCHEMA"})),
        (frozenset({"--once"}), frozenset()),
    ]
    with pytest.raises(AssertionError, match="missing from the docs"):
        check(options, options[:1])
    with pytest.raises(AssertionError, match="do not exist"):
        check(options[:1], options)
    with pytest.raises(AssertionError, match="environment variables differ"):
        check(options, [options[0], (frozenset({"--once"}), frozenset({"ONCE"}))])
    with pytest.raises(AssertionError, match="split over rows"):
        check(
            options,
            [
                (frozenset({"-s"}), frozenset({"GRAPHILE_WORKER_SCHEMA"})),
                (frozenset({"--schema"}), frozenset({"GRAPHILE_WORKER_SCHEMA"})),
                options[1],
            ],
        )
