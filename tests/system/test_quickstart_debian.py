"""The README's Quickstart, followed literally on a fresh Debian machine.

A container of Debian bookworm with Python 3.11, its venv module and nothing
else (the ``python:3.11-slim-bookworm`` image, or its debootstrap stand-in:
see tests/support/docker_base.py; with Debian's "externally managed" marker, so a
system-wide ``pip install`` is refused as on Debian) gets this checkout's
tracked files, and runs the
Quickstart's commands as written: the first one (a virtual environment, the
install from PyPI through the host's network, the worker on the example
tasks with an embedded PostgreSQL) in the background; then, from "another
terminal" in the same folder with the environment activated as the README
says, its `add-job` command and its Python snippet, with the URL the worker
printed. Both jobs must be run by the worker. Needs Docker and the package
registries (skipped without Docker, unless GRAPHILE_WORKER_REQUIRE_DOCKER=1).
"""

from __future__ import annotations

import io
import os
import re
import shlex
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest
from docker_base import BASE_TAG, BaseUnavailable, ensure_base_image

pytestmark = [pytest.mark.db, pytest.mark.slow, pytest.mark.timeout(1200)]

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
DOCKER_RUN = ("docker", "run", "--rm", "--network", "host")


def quickstart() -> str:
    start = README.index("\n## Quickstart\n")
    return README[start : README.index("\n## ", start + 1)]


def block(lang: str, index: int = 0) -> str:
    return re.findall(rf"```{lang}\n(.*?)```", quickstart(), flags=re.S)[index]


def require_docker() -> None:
    reason = None
    if shutil.which("docker") is None:
        reason = "the docker command is not installed"
    elif subprocess.run(["docker", "info"], capture_output=True, check=False).returncode != 0:
        reason = "the Docker daemon is not running"
    else:
        try:
            ensure_base_image(lambda line: None)
        except BaseUnavailable as exc:
            reason = f"no {BASE_TAG} image: {exc}"
    if reason is None:
        return
    if os.environ.get("GRAPHILE_WORKER_REQUIRE_DOCKER", "") not in ("", "0"):
        pytest.fail(f"the Quickstart test must run here: {reason}", pytrace=False)
    pytest.skip(f"Quickstart on Debian: {reason}")


def checkout_tar() -> bytes:
    """The tracked files of this checkout, as they are in the working tree."""
    files = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name in filter(None, files):
            path = ROOT / name.decode()
            if path.is_file():
                tar.add(path, arcname=name.decode())
    return buffer.getvalue()


def test_the_quickstart_on_a_fresh_debian_machine(tmp_path: Path) -> None:
    require_docker()
    first = block("bash").strip()
    assert first.startswith("python3 -m venv .venv && . .venv/bin/activate && pip install")
    add_job = next(
        line.removeprefix("$ ") for line in block("text", 1).splitlines() if line.startswith("$ ")
    )
    snippet = block("python")
    (tmp_path / "checkout.tar").write_bytes(checkout_tar())
    (tmp_path / "snippet.py").write_text(snippet)
    script = f"""
set -e
# Debian's own python3 refuses a system-wide pip install (PEP 668), as the
# official image's Python does not: the marker Debian ships, put back.
printf '[externally-managed]\nError=use a virtual environment\n' \
  > "$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')/EXTERNALLY-MANAGED"
mkdir /app && cd /app && tar -xf /in/checkout.tar
( {first} ) >/tmp/worker.log 2>&1 &
worker=$!
for _ in $(seq 600); do
  grep -q "Embedded PostgreSQL" /tmp/worker.log && break
  kill -0 $worker 2>/dev/null || {{ cat /tmp/worker.log; exit 1; }}  # it stopped
  sleep 0.5
done
for _ in $(seq 100); do grep -q "heartbeat every" /tmp/worker.log && break; sleep 0.2; done
# Another terminal: the environment activated, the URL the worker printed.
. .venv/bin/activate
export DATABASE_URL="$(grep -o 'postgresql://[^ ]*' /tmp/worker.log | head -1)"
{add_job}
python /in/snippet.py
for _ in $(seq 100); do grep -q "Hello, Python!" /tmp/worker.log && break; sleep 0.1; done
cat /tmp/worker.log
"""
    done = subprocess.run(
        [*DOCKER_RUN, "-v", f"{tmp_path}:/in:ro", BASE_TAG, "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-3000:]
    assert "Hello, CLI!" in log and "Hello, Python!" in log, log[-3000:]
    assert "Traceback" not in log, log[-3000:]
    assert shlex.split(add_job)[:2] == ["graphile-worker", "add-job"]
