"""The Docker image, built from the repository's Dockerfile and run (issue 29 §2).

tests/system/test_docker.py lints the Dockerfile and imitates the image on the host;
this module builds the real image with Docker and runs it the way the README's
"Docker" section says: host networking, DATABASE_URL, the tasks mounted
read-only at /worker/tasks, flags after the image name. It checks that
``--schema-only`` installs the schema, that ``--once`` runs a job added with
``graphile_worker.add_job(...)``, that ``docker stop`` ends a waiting worker
gracefully well inside Docker's 10 s, and that nothing in it runs as root.

No registry is reachable where the suite runs: ``python:3.11-slim-bookworm`` is
a stand-in made with debootstrap and cached (tests/support/docker_base.py); a machine
that has the real image uses it. The image's size is printed in the terminal
summary ("Docker image").

Without a Docker daemon, or without debootstrap when the stand-in must be
built, the tests are skipped; with GRAPHILE_WORKER_REQUIRE_DOCKER=1 (CI) they
fail instead. The tests do not start a Docker daemon themselves.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import pytest
from dbhelpers import rows, value
from docker_base import BASE_TAG, RECIPE_LABEL, BaseUnavailable, ensure_base_image
from psycopg.conninfo import conninfo_to_dict

# Cold, the stand-in base is built first (about a minute here): more than the
# suite's 5 minutes per test would allow on a slow network.
pytestmark = [pytest.mark.db, pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
IMAGE_TAG = "graphile-worker-py:test"
#: The build stage, tagged so that its layers stay cached (see :func:`_build`).
BUILDER_TAG = "graphile-worker-py:test-builder"
REQUIRE_ENV = "GRAPHILE_WORKER_REQUIRE_DOCKER"
#: The image's user (the Dockerfile's USER).
WORKER_UID = 10001
#: How long `docker stop` may take: the worker stops by itself on SIGTERM,
#: long before Docker's 10 s kill.
STOP_LIMIT = 5.0


def docker(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run the docker CLI and capture its output (no check: callers assert)."""
    return subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _output(done: subprocess.CompletedProcess[str], lines: int = 40) -> str:
    """The last lines of a command's output, for an assertion message."""
    return "\n".join((done.stdout + done.stderr).strip().splitlines()[-lines:])


def _docker_problem() -> str | None:
    """Why Docker cannot be used here (None: it can)."""
    if shutil.which("docker") is None:
        return "the docker command is not installed (apt-get install docker.io)"
    try:
        done = docker("info", "--format", "{{.ServerVersion}}", timeout=30)
    except subprocess.TimeoutExpired:
        return "the Docker daemon did not answer `docker info` within 30 s"
    if done.returncode != 0 or not done.stdout.strip():
        first = (done.stderr.strip().splitlines() or ["no output"])[0]
        return f"the Docker daemon is not running (`docker info`: {first})"
    return None


@dataclass
class Report:
    """A pytest plugin printing what the build did in the terminal summary:
    the image's size, and how long the base and the build took."""

    lines: list[str] = field(default_factory=list)

    def add(self, line: str) -> None:
        self.lines.append(line)
        print(f"[docker image] {line}", flush=True)  # shown at once with -s

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        terminalreporter.section("Docker image")
        for line in self.lines:
            terminalreporter.write_line(line)


def _unavailable(report: Report, reason: str) -> NoReturn:
    """Skip, or fail where the tests must run (GRAPHILE_WORKER_REQUIRE_DOCKER=1)."""
    if os.environ.get(REQUIRE_ENV, "") not in ("", "0"):
        pytest.fail(
            f"the Docker image tests must run here ({REQUIRE_ENV}): {reason}", pytrace=False
        )
    report.add(f"SKIPPED, the image was not built: {reason} (set {REQUIRE_ENV}=1 to fail instead)")
    pytest.skip(f"Docker image tests: {reason}")


def _size(tag: str) -> int:
    """An image's size in bytes, as `docker images` counts it (all its layers)."""
    done = docker("image", "inspect", "--format", "{{.Size}}", tag)
    assert done.returncode == 0, _output(done)
    return int(done.stdout)


def _build(report: Report) -> None:
    """`docker build --network host` of the Dockerfile, with the layer cache.

    The build stage is tagged too (a first, cached build with ``--target``):
    then removing the dangling images left by earlier builds (those made from
    the stand-in carry its label) keeps the current cache and frees the rest.
    """
    started = time.monotonic()
    for target in (["--target", "builder", "-t", BUILDER_TAG], ["-t", IMAGE_TAG]):
        done = docker("build", "--network", "host", *target, str(ROOT), timeout=900)
        assert done.returncode == 0, f"docker build failed:\n{_output(done)}"
    report.add(f"docker build: {time.monotonic() - started:.1f} s")
    docker("image", "prune", "--force", "--filter", f"label={RECIPE_LABEL}")


@dataclass
class BuiltImage:
    """The image the tests run, and the report its figures go to."""

    tag: str
    report: Report


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest) -> BuiltImage:
    """The image built from the Dockerfile, on the real or stand-in base."""
    report = Report()
    if not request.config.pluginmanager.has_plugin("graphile-worker-docker-image"):
        request.config.pluginmanager.register(report, "graphile-worker-docker-image")
    problem = _docker_problem()
    if problem:
        _unavailable(report, problem)
    started = time.monotonic()
    try:
        report.add(ensure_base_image(report.add))
    except BaseUnavailable as exc:
        _unavailable(report, f"cannot make the {BASE_TAG} stand-in: {exc}")
    build_started = time.monotonic()
    _build(report)
    size, base = _size(IMAGE_TAG), _size(BASE_TAG)
    report.add(
        f"{IMAGE_TAG}: {size / 1e6:.1f} MB ({BASE_TAG} {base / 1e6:.1f} MB"
        f" + {(size - base) / 1e6:.1f} MB from the Dockerfile)"
    )
    report.add(
        f"ready in {time.monotonic() - started:.1f} s"
        f" (base {build_started - started:.1f} s, build {time.monotonic() - build_started:.1f} s)"
    )
    return BuiltImage(IMAGE_TAG, report)


def database_access(url: str) -> tuple[list[str], str]:
    """The `docker run` arguments that let a container reach ``url``'s server,
    and the URL to give it.

    With host networking a TCP host is reached as it is from here. A server
    listening on a unix socket only (the suite's throwaway server) is reached
    through its socket file, mounted at the same path: the folder holding it
    is the server's data folder, which the image's user may not enter.
    """
    params = conninfo_to_dict(url)
    host = str(params.get("host") or "")
    network = ["--network", "host"]
    if not host.startswith("/"):
        assert host, f"the test database URL names no host: {url}"
        return network, url
    socket = Path(host) / f".s.PGSQL.{params.get('port') or 5432}"
    assert socket.is_socket(), f"no PostgreSQL socket at {socket}"
    return [*network, "-v", f"{socket}:{socket}"], url


def run_image(
    image: BuiltImage, db_url: str, *args: str, volumes: tuple[str, ...] = (), timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`docker run --rm` of the image as the README shows, with ``args`` after its name."""
    access, url = database_access(db_url)
    mounts = [arg for volume in volumes for arg in ("-v", volume)]
    return docker(
        "run", "--rm", *access, "-e", f"DATABASE_URL={url}", *mounts, image.tag, *args,
        timeout=timeout,
    )  # fmt: skip


RECORD_TASK = '''
"""Task `record`: writes a row naming its job and the user it runs as."""
import os


async def task(payload, helpers):
    await helpers.query(
        "insert into public.docker_runs (job_id, note, uid) values (%s, %s, %s)",
        (helpers.job.id, payload["note"], os.getuid()),
    )
'''


@pytest.fixture
def tasks_dir(tmp_path: Path) -> Path:
    """A tasks folder to mount read-only at /worker/tasks, readable by the image's user."""
    folder = tmp_path / "tasks"
    folder.mkdir()
    folder.chmod(0o755)
    (folder / "record.py").write_text(RECORD_TASK)
    (folder / "record.py").chmod(0o644)
    return folder


def _add_record_job(db: str, note: str) -> int:
    """Add a `record` job with SQL, as an application would; returns its id."""
    rows(db, "create table if not exists public.docker_runs (job_id bigint, note text, uid int)")
    job_id = value(
        db,
        "select (graphile_worker.add_job('record', json_build_object('note', %s::text))).id",
        (note,),
    )
    return int(job_id)


def test_runs_as_non_root(image: BuiltImage) -> None:
    """The image's user is 10001:10001, and that is who its commands run as."""
    done = docker("image", "inspect", "--format", "{{.Config.User}}", image.tag)
    assert done.stdout.strip() == f"{WORKER_UID}:{WORKER_UID}", _output(done)
    done = docker("run", "--rm", "--entrypoint", "id", image.tag)
    assert done.returncode == 0, _output(done)
    assert done.stdout.split()[:2] == [f"uid={WORKER_UID}(worker)", f"gid={WORKER_UID}(worker)"]


#: The schema's revisions: Node's and the Python-only ones.
REVISIONS = """
  select (select array_agg(id order by id) from graphile_worker.migrations) as node,
    (select count(*) from graphile_worker._private_py_migrations) as py
"""


def test_schema_only_installs_the_schema(image: BuiltImage, empty_db: str, db: str) -> None:
    """--schema-only in an empty database: the schema ``db`` has (installed here)."""
    done = run_image(image, empty_db, "--schema-only")
    assert done.returncode == 0, _output(done)
    assert "Traceback" not in done.stderr, _output(done)
    assert value(empty_db, "select to_regclass('graphile_worker._private_jobs')::text")
    assert rows(empty_db, REVISIONS) == rows(db, REVISIONS)


def test_once_runs_a_job_from_read_only_tasks(image: BuiltImage, db: str, tasks_dir: Path) -> None:
    """--once with the tasks mounted read-only: the job runs once, as the image's
    user, and is gone; nothing is written to the mounted folder."""
    job_id = _add_record_job(db, "hello from SQL")
    done = run_image(image, db, "--once", volumes=(f"{tasks_dir}:/worker/tasks:ro",))
    assert done.returncode == 0, _output(done)
    assert "Traceback" not in done.stderr, _output(done)
    assert rows(db, "select job_id, note, uid from public.docker_runs") == [
        {"job_id": job_id, "note": "hello from SQL", "uid": WORKER_UID}
    ]
    assert value(db, "select count(*) from graphile_worker._private_jobs") == 0
    assert not list(tasks_dir.rglob("__pycache__"))


def _container_state(name: str) -> dict[str, object]:
    """A container's state (Running, ExitCode, ...) from `docker container inspect`."""
    done = docker("container", "inspect", "--format", "{{json .State}}", name)
    assert done.returncode == 0, _output(done)
    state: dict[str, object] = json.loads(done.stdout)
    return state


@pytest.fixture
def container_name() -> Iterator[str]:
    """A unique container name; the container is removed after the test."""
    name = f"graphile-worker-py-test-{uuid.uuid4().hex[:12]}"
    yield name
    docker("rm", "--force", name)


def test_docker_stop_ends_a_waiting_worker_gracefully(
    image: BuiltImage, db: str, tasks_dir: Path, container_name: str
) -> None:
    """A worker left waiting for jobs (no --once), as a service runs it: `docker
    stop` sends SIGTERM through tini, and it exits 0 well inside Docker's 10 s."""
    access, url = database_access(db)
    done = docker(
        "run", "--detach", "--name", container_name, *access, "-e", f"DATABASE_URL={url}",
        "-v", f"{tasks_dir}:/worker/tasks:ro", image.tag,
    )  # fmt: skip
    assert done.returncode == 0, _output(done)
    # Running and waiting: it runs a job added now, and stays up.
    job_id = _add_record_job(db, "while waiting")
    deadline = time.monotonic() + 60
    while not value(db, "select count(*) from public.docker_runs"):
        if not _container_state(container_name)["Running"]:
            pytest.fail(f"the worker exited:\n{_output(docker('logs', container_name))}")
        assert time.monotonic() < deadline, "the waiting worker did not run the job within 60 s"
        time.sleep(0.1)
    assert rows(db, "select job_id, uid from public.docker_runs") == [
        {"job_id": job_id, "uid": WORKER_UID}
    ]
    # Every process in the container (tini, the worker) runs as the image's user.
    done = docker("top", container_name, "-eo", "pid,uid,args")
    assert done.returncode == 0, _output(done)
    processes = [line.split(None, 2) for line in done.stdout.strip().splitlines()[1:]]
    assert len(processes) >= 2 and {uid for _, uid, _ in processes} == {str(WORKER_UID)}, (
        done.stdout
    )

    started = time.monotonic()
    done = docker("stop", container_name, timeout=30)
    took = time.monotonic() - started
    assert done.returncode == 0, _output(done)
    state = _container_state(container_name)
    logs = docker("logs", container_name)
    image.report.add(f"docker stop of a waiting worker: {took:.2f} s")
    assert state["ExitCode"] == 0, f"exit code {state['ExitCode']}:\n{_output(logs)}"
    assert took < STOP_LIMIT, f"docker stop took {took:.1f} s (limit {STOP_LIMIT} s)"
    assert "stopping (SIGTERM received)" in logs.stderr, _output(logs)
    assert "Traceback" not in logs.stderr, _output(logs)
