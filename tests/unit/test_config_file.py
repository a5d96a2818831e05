"""The configuration file (-C/--config, pyproject.toml's [tool.graphile-worker]):
its keys, what they accept, how it ranks against the environment and the
command line, its error messages, and load_config() for library mode."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from worker_cli import ConfigurationError, load_config
from worker_cli.cli import commands as cli_module
from worker_cli.cli.commands import command
from worker_cli.config.file import ConfigFileError, option_keys
from worker_cli.config.options import FLAGS

pytestmark = pytest.mark.unit

OPTIONS_PAGE = Path(__file__).resolve().parents[2] / "docs" / "reference" / "options.md"

#: Environment variables of the options, cleared for every test.
OPTION_ENVVARS = (
    "DATABASE_URL",
    "GRAPHILE_WORKER_SCHEMA",
    "GRAPHILE_WORKER_CONFIG",
    "GRAPHILE_WORKER_LOG_FORMAT",
    "GRAPHILE_WORKER_PROGRESS_INTERVAL",
    *(flag.envvar for flag in FLAGS if flag.envvar),
)


@pytest.fixture(autouse=True)
def _clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in OPTION_ENVVARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


class Captured:
    """What the worker would have been started with."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, connection: str | None, settings: dict[str, Any], **options: Any) -> None:
        self.calls.append({"connection": connection, **settings, **options})

    @property
    def settings(self) -> dict[str, Any]:
        [call] = self.calls
        return call


@pytest.fixture
def worker(monkeypatch: pytest.MonkeyPatch) -> Captured:
    """Run the command in-process up to the point where it starts the worker."""
    captured = Captured()
    monkeypatch.setattr(cli_module, "run_worker", captured)
    monkeypatch.setattr(cli_module.logs, "configure", lambda *args, **kwargs: None)
    return captured


def invoke(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(command, list(args), env=env)


def test_every_long_option_is_a_key_except_help_version_and_config() -> None:
    ctx = click.Context(command, **command.context_settings)
    keys = option_keys(command, ctx)
    assert {"help", "version", "config"} <= set(keys)
    for flag in FLAGS:
        long_name = next(name for name in flag.names if name.startswith("--"))
        assert keys[long_name[2:]].name == flag.field
    assert keys["connection"].name == "connection"
    assert keys["tasks"].name == "tasks_dir"
    assert keys["crontab"].name == "crontab_path"


def test_file_then_environment_then_command_line(worker: Captured, tmp_path: Path) -> None:
    (tmp_path / "worker.toml").write_text(
        'connection = "postgres:///from_file"\n'
        'schema = "file_schema"\n'
        "local-queue-size = 7\n"
        "use-local-time = true\n"
        "poll-interval = 500\n"
        "jobs = 3\n"
    )
    assert invoke("-C", "worker.toml").exit_code == 0
    assert (
        invoke(
            "-C",
            "worker.toml",
            env={
                "DATABASE_URL": "postgres:///from_env",
                "GRAPHILE_WORKER_SCHEMA": "env_schema",
                "GRAPHILE_WORKER_LOCAL_QUEUE_SIZE": "8",
                "GRAPHILE_WORKER_USE_LOCAL_TIME": "0",
            },
        ).exit_code
        == 0
    )
    result = invoke(
        "-C",
        "worker.toml",
        "-c",
        "postgres:///from_flag",
        "-s",
        "flag_schema",
        "--local-queue-size",
        "9",
        "-j",
        "4",
        env={
            "DATABASE_URL": "postgres:///from_env",
            "GRAPHILE_WORKER_SCHEMA": "env_schema",
            "GRAPHILE_WORKER_LOCAL_QUEUE_SIZE": "8",
        },
    )
    assert result.exit_code == 0, result.output
    file, env, flags = worker.calls
    assert (file["connection"], file["schema"], file["local_queue_size"]) == (
        "postgres:///from_file",
        "file_schema",
        7,
    )
    assert (file["use_local_time"], file["poll_interval"], file["concurrency"]) == (True, 0.5, 3)
    assert (env["connection"], env["schema"], env["local_queue_size"]) == (
        "postgres:///from_env",
        "env_schema",
        8,
    )
    assert env["use_local_time"] is False  # GRAPHILE_WORKER_USE_LOCAL_TIME=0 beats the file
    assert (env["poll_interval"], env["concurrency"]) == (0.5, 3)  # no variable: the file's
    assert (flags["connection"], flags["schema"], flags["local_queue_size"]) == (
        "postgres:///from_flag",
        "flag_schema",
        9,
    )
    assert (flags["concurrency"], flags["poll_interval"]) == (4, 0.5)


def test_without_a_file_the_defaults_apply(worker: Captured) -> None:
    assert invoke().exit_code == 0
    settings = worker.settings
    assert settings["local_queue_size"] == 4000 and settings["use_local_time"] is False
    assert settings["task_directory"] == Path("tasks")


def test_pyproject_table_is_read_by_default(worker: Captured, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "app"\n\n[tool.graphile-worker]\njobs = 5\ntasks = "jobs/tasks"\n'
    )
    assert invoke().exit_code == 0
    assert worker.settings["concurrency"] == 5
    assert worker.settings["task_directory"] == Path("jobs/tasks")


def test_a_pyproject_without_the_table_is_fine(worker: Captured, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "app"\n[tool.ruff]\nx = 1\n')
    assert invoke().exit_code == 0
    assert worker.settings["concurrency"] == 1


def test_paths_in_a_file_are_relative_to_its_folder(worker: Captured, tmp_path: Path) -> None:
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "worker.toml").write_text('tasks = "tasks"\ncrontab = "/etc/crontab"\n')
    assert invoke("-C", "deploy/worker.toml").exit_code == 0
    assert worker.settings["task_directory"] == Path("deploy/tasks")
    assert worker.settings["crontab_file"] == Path("/etc/crontab")


def test_the_environment_names_the_file_and_a_given_file_beats_pyproject(
    worker: Captured, tmp_path: Path
) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.graphile-worker]\njobs = 5\n")
    (tmp_path / "other.toml").write_text("jobs = 6\n")
    assert invoke(env={"GRAPHILE_WORKER_CONFIG": "other.toml"}).exit_code == 0
    assert invoke("-C", "other.toml").exit_code == 0
    assert [call["concurrency"] for call in worker.calls] == [6, 6]


def test_a_flag_turned_on_in_the_file(worker: Captured, tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text("once = true\nno-prepared-statements = true\n")
    assert invoke("-C", "w.toml").exit_code == 0
    assert worker.settings["once"] is True and worker.settings["no_prepared_statements"] is True
    result = invoke("-C", "w.toml", "--schema-only")
    assert result.exit_code == 2
    assert "--once and --schema-only cannot be used together" in result.output


ERRORS = [
    ('jobs = "4"\n', "w.toml: key 'jobs': expected an integer from 1 to 10000, got \"4\""),
    ("jobs = 0\n", "w.toml: key 'jobs': expected an integer from 1 to 10000, got 0"),
    ("jobs = 2.5\n", "w.toml: key 'jobs': expected an integer from 1 to 10000, got 2.5"),
    ("jobs = true\n", "w.toml: key 'jobs': expected an integer from 1 to 10000, got true"),
    (
        "complete-job-batch-delay = 20000\n",
        "w.toml: key 'complete-job-batch-delay': expected an integer from 0 to 10000, got 20000",
    ),
    (
        "heartbeat-timeout = 0\n",
        "w.toml: key 'heartbeat-timeout': expected a number > 0 and <= 86400, got 0",
    ),
    (
        "jobs = 2147483648\n",
        "w.toml: key 'jobs': expected an integer from 1 to 10000, got 2147483648",
    ),
    (
        "heartbeat-interval = inf\n",
        "w.toml: key 'heartbeat-interval': expected a number from 0 to 3600, got inf",
    ),
    (
        "heartbeat-interval = nan\n",
        "w.toml: key 'heartbeat-interval': expected a number from 0 to 3600, got nan",
    ),
    (
        "poll-interval = 1e300\n",
        "w.toml: key 'poll-interval': expected an integer from 1 to 3600000, got 1e+300",
    ),
    (
        "progress-interval = inf\n",
        "w.toml: key 'progress-interval': expected a number from 0 to 3600, got inf",
    ),
    ('schema = ""\n', "w.toml: key 'schema': a schema name must not be empty"),
    (
        'schema = "pg_temp_x"\n',
        "w.toml: key 'schema': schema name 'pg_temp_x' starts with pg_, which PostgreSQL "
        "reserves for system schemas",
    ),
    ("once = 1\n", "w.toml: key 'once': expected true or false, got 1"),
    ('schema = ["a"]\n', "w.toml: key 'schema': expected a string, got an array"),
    ("tasks = { a = 1 }\n", "w.toml: key 'tasks': expected a string, got a table"),
    (
        'log-format = "xml"\n',
        'w.toml: key \'log-format\': expected one of "text", "json", got "xml"',
    ),
    (
        'cleanup = "GC_EVERYTHING"\n',
        "w.toml: key 'cleanup': unknown cleanup task GC_EVERYTHING; choose from "
        "GC_TASK_IDENTIFIERS, GC_JOB_QUEUES, DELETE_PERMAFAILED_JOBS, GC_UNIQUE_LOCKS",
    ),
    ("version = true\n", "w.toml: 'version' cannot be set in a config file"),
    ("help = true\n", "w.toml: 'help' cannot be set in a config file"),
    ('config = "other.toml"\n', "w.toml: 'config' cannot be set in a config file"),
    (
        "jobs = 4\nx y = 1\n",
        "w.toml, line 2: not valid TOML: Expected '=' after a key in a key/value pair (column 3)",
    ),
    ("jobs = [1,\n", "w.toml, line 1: not valid TOML: Invalid value (end of file)"),
    (b"jobs = 4\nschema = '\xff'\n", "w.toml, line 2: not UTF-8 text"),
]


@pytest.mark.parametrize(("content", "message"), ERRORS)
def test_a_bad_file_is_one_line_naming_file_key_and_expectation_exit_2(
    worker: Captured, tmp_path: Path, content: str | bytes, message: str
) -> None:
    path = tmp_path / "w.toml"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    result = invoke("-C", "w.toml")
    assert result.exit_code == 2
    assert result.stderr == f"Error: {message}\n"
    assert worker.calls == []


def test_an_unknown_key_suggests_the_nearest_and_lists_the_keys(
    worker: Captured, tmp_path: Path
) -> None:
    (tmp_path / "w.toml").write_text("poll_interval = 100\n")
    result = invoke("-C", "w.toml")
    assert result.exit_code == 2
    [line] = result.stderr.splitlines()
    prefix = (
        "Error: w.toml: unknown key 'poll_interval' (did you mean 'poll-interval'?); known keys: "
    )
    assert line.startswith(prefix)
    keys = line.removeprefix(prefix).split(", ")
    assert {"connection", "schema", "jobs", "poll-interval", "tasks", "crontab"} <= set(keys)
    assert {"use-local-time", "local-queue-size"} <= set(keys)
    assert not {"help", "version", "config"} & set(keys)


def test_a_bad_pyproject_table_names_the_table(worker: Captured, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.graphile-worker]\njob = 4\n")
    result = invoke()
    assert result.exit_code == 2
    assert result.stderr.startswith(
        "Error: pyproject.toml [tool.graphile-worker]: unknown key 'job' (did you mean 'jobs'?);"
    )
    (tmp_path / "pyproject.toml").write_text("[tool]\ngraphile-worker = 3\n")
    result = invoke()
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: pyproject.toml: [tool.graphile-worker] must be a table, not 3\n",
    )


def test_a_missing_config_file_is_an_error(worker: Captured) -> None:
    result = invoke("-C", "missing.toml")
    assert (result.exit_code, result.stderr) == (
        2,
        "Error: cannot read config file 'missing.toml': No such file or directory\n",
    )


def test_config_may_come_before_a_subcommand_but_not_other_worker_flags() -> None:
    result = invoke("-C", "missing.toml", "status")
    assert result.exit_code == 2 and "cannot read config file 'missing.toml'" in result.stderr
    result = invoke("-j", "2", "status")
    assert result.exit_code == 2 and "-j" in result.stderr


# --- library mode ------------------------------------------------------------


def test_load_config_gives_run_keywords_in_runs_units(tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text(
        'connection = "postgres:///app"\njobs = 3\npoll-interval = 500\n'
        'complete-job-batch-delay = 4\ntasks = "tasks"\ncrontab = "crontab"\nonce = true\n'
        "use-local-time = true\nheartbeat-interval = 10\nprogress-interval = 2\n"
        'log-format = "json"\nschema-only = false\ncleanup = "GC_JOB_QUEUES"\n'
    )
    assert load_config(tmp_path / "w.toml") == {
        "connection_string": "postgres:///app",
        "concurrency": 3,
        "poll_interval": 0.5,
        "complete_job_batch_delay": 0.004,
        "task_directory": tmp_path / "tasks",
        "crontab_file": tmp_path / "crontab",
        "once": True,
        "use_local_time": True,
        "heartbeat_interval": 10.0,
        "progress_interval": 2.0,
    }


def test_load_config_reads_pyproject_by_default(tmp_path: Path) -> None:
    assert load_config() == {}
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "app"\n')
    assert load_config() == {}
    (tmp_path / "pyproject.toml").write_text("[tool.graphile-worker]\njobs = 2\n")
    assert load_config() == {"concurrency": 2}


def test_load_config_lets_the_environment_win_as_the_command_line_does(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "w.toml").write_text(
        'connection = "postgres:///file"\nschema = "file"\nlocal-queue-size = 7\njobs = 2\n'
    )
    monkeypatch.setenv("DATABASE_URL", "postgres:///env")
    monkeypatch.setenv("GRAPHILE_WORKER_LOCAL_QUEUE_SIZE", "8")
    assert load_config("w.toml") == {
        "connection_string": "postgres:///env",
        "schema": "file",
        "local_queue_size": 8,
        "concurrency": 2,
    }
    monkeypatch.setenv("GRAPHILE_WORKER_LOCAL_QUEUE_SIZE", "many")
    with pytest.raises(ConfigurationError, match=r"^GRAPHILE_WORKER_LOCAL_QUEUE_SIZE: "):
        load_config("w.toml")


def test_load_config_errors_are_the_command_lines(tmp_path: Path) -> None:
    (tmp_path / "w.toml").write_text("jobs = 0\n")
    with pytest.raises(ConfigFileError) as raised:
        load_config("w.toml")
    assert str(raised.value) == "w.toml: key 'jobs': expected an integer from 1 to 10000, got 0"
    assert isinstance(raised.value, ConfigurationError) and raised.value.exit_code == 2
    with pytest.raises(ConfigFileError, match=r"^cannot read config file 'nope\.toml'"):
        load_config("nope.toml")


def _readme_config_example() -> str:
    text = OPTIONS_PAGE.read_text()
    section = text[text.index("### Configuration file") :]
    found = re.search(r"```toml\n(.*?)```", section, re.S)
    assert found, "the docs' Configuration file section has a TOML example"
    return found[1]


def test_the_readme_example_is_accepted(worker: Captured, tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(_readme_config_example())
    result = invoke()
    assert result.exit_code == 0, result.output
    assert load_config()  # and in library mode


def test_options_that_disagree_name_the_keys_the_file_set(worker: Captured, tmp_path: Path) -> None:
    """A check across options (the heartbeat timeout at least twice the
    interval) names the file and the keys it set among the options at fault;
    one set on the command line is named by the message alone."""
    (tmp_path / "w.toml").write_text("heartbeat-interval = 60\nheartbeat-timeout = 70\n")
    result = invoke("-C", "w.toml")
    assert (result.exit_code, result.stderr.splitlines()[-1]) == (
        2,
        "Error: heartbeat_timeout (70s) must be at least twice heartbeat_interval (60s) "
        "(w.toml: key 'heartbeat-interval', key 'heartbeat-timeout')",
    )
    result = invoke("-C", "w.toml", "--heartbeat-timeout", "100")
    assert (result.exit_code, result.stderr.splitlines()[-1]) == (
        2,
        "Error: heartbeat_timeout (100s) must be at least twice heartbeat_interval (60s) "
        "(w.toml: key 'heartbeat-interval')",
    )
    result = invoke("--heartbeat-interval", "60", "--heartbeat-timeout", "70")
    assert (result.exit_code, result.stderr.splitlines()[-1]) == (
        2,
        "Error: heartbeat_timeout (70s) must be at least twice heartbeat_interval (60s)",
    )
    assert worker.calls == []
