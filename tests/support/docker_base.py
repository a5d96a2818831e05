"""A stand-in for the Docker Hub image ``python:3.11-slim-bookworm``, for
tests/system/test_docker_image.py where no image registry is reachable.

The Dockerfile builds ``FROM python:3.11-slim-bookworm``. Without a registry,
that tag is given to a Debian bookworm root filesystem made with ``debootstrap``
(variant minbase) holding Debian's Python 3.11 with venv and pip, made to behave
like the official image for what the Dockerfile runs:

- ``python`` and ``pip`` in /usr/local/bin, first on PATH;
- no PEP 668 marker (Debian's Python is "externally managed", the official
  image's is not), so ``pip wheel`` and ``pip --python VENV install`` run as
  they do there;
- the apt sources of the official image (bookworm, bookworm-updates,
  bookworm-security; deb822), on the mirrors this machine's apt uses, so
  ``apt-get install tini=...`` finds Debian's package;
- this machine's CA bundle, so pip and apt reach the registries through
  whatever this machine trusts.

The root filesystem is kept as a tarball in a cache folder outside the
repository (``$XDG_CACHE_HOME/graphile-worker-py/docker-base``, by default
``~/.cache/...``), named by a digest of its recipe: a changed recipe (or CA
bundle, or mirror) builds a new one. The imported image carries that digest as
a label, so an image already imported from the same recipe is used as it is.
An image of that tag that is not a stand-in (the real one, pulled) is never
replaced.

Building needs root (debootstrap) and the network; importing needs Docker.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from fnmatch import fnmatchcase
from pathlib import Path

#: The tag the Dockerfile builds from.
BASE_TAG = "python:3.11-slim-bookworm"
#: The label holding the recipe's digest on an imported stand-in.
RECIPE_LABEL = "org.graphile-worker-py.stand-in-recipe"
#: What the official image sets (``docker image inspect python:3.11-slim-bookworm``);
#: its Python's own variables (PYTHON_VERSION, GPG_KEY, ...) are left out.
IMAGE_CHANGES = (
    "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "ENV LANG=C.UTF-8",
    'CMD ["python3"]',
)
#: This machine's CA bundle (Debian's path; also where Debian's pip looks).
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
DEFAULT_MIRRORS = ("http://deb.debian.org/debian", "http://deb.debian.org/debian-security")
SIGNED_BY = "/usr/share/keyrings/debian-archive-keyring.gpg"
#: Files a slim Debian image leaves out (dpkg ``path-exclude``), and the
#: exceptions it keeps (``path-include``): licences and the locale aliases.
SLIM_EXCLUDED = (
    "usr/share/doc/*",
    "usr/share/man/*",
    "usr/share/info/*",
    "usr/share/groff/*",
    "usr/share/lintian/overrides/*",
    "usr/share/locale/*",
)
SLIM_KEPT = ("usr/share/doc/*/copyright", "usr/share/locale/locale.alias")
#: apt as in the slim images: no binary caches (``apt-get update`` would leave
#: ~80 MB in the layer), downloaded packages removed, no translations.
SLIM_APT = """\
Dir::Cache::pkgcache "";
Dir::Cache::srcpkgcache "";
DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb || true"; };
Acquire::Languages "none";
Acquire::GzipIndexes "true";
"""


class BaseUnavailable(RuntimeError):
    """The stand-in cannot be made on this machine (the message says why)."""


@dataclass(frozen=True)
class Recipe:
    """Everything the stand-in is made of: its digest names the cached tarball."""

    suite: str
    variant: str
    packages: tuple[str, ...]
    mirror: str
    security_mirror: str
    ca_bundle_sha256: str
    image_changes: tuple[str, ...]
    slim: tuple[str, ...]
    #: Bump when :func:`build_tarball` changes what it does to the root filesystem.
    revision: int = 1

    def digest(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:16]


def _sources_entries(apt_dir: Path) -> list[tuple[list[str], list[str]]]:
    """(URIs, suites) of the apt sources on this machine that serve a ``main``
    component (Debian's, not a vendor's), one-line and deb822."""
    entries: list[tuple[list[str], list[str]]] = []
    one_line = [apt_dir / "sources.list", *sorted(apt_dir.glob("sources.list.d/*.list"))]
    for path in one_line:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            words = [w for w in line.split("#")[0].split() if not w.startswith("[")]
            if len(words) >= 4 and words[0] == "deb" and "main" in words[3:]:
                entries.append(([words[1]], [words[2]]))
    for path in sorted(apt_dir.glob("sources.list.d/*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields: dict[str, list[str]] = {}
            for line in stanza.splitlines():
                name, colon, rest = line.partition(":")
                if colon and not line.startswith(("#", " ")):
                    fields[name.strip().lower()] = rest.split()
            enabled = fields.get("enabled", ["yes"]) != ["no"]
            if (
                enabled
                and "deb" in fields.get("types", [])
                and "main" in fields.get("components", [])
            ):
                entries.append((fields.get("uris", []), fields.get("suites", [])))
    return entries


def host_mirrors(suite: str = "bookworm", apt_dir: Path = Path("/etc/apt")) -> tuple[str, str]:
    """The Debian mirror and security mirror this machine's apt uses for ``suite``
    (Debian's defaults where it has none)."""
    mirror, security = DEFAULT_MIRRORS
    found_main = found_security = False
    for uris, suites in _sources_entries(apt_dir):
        if not uris:
            continue
        if suite in suites and not found_main:
            mirror, found_main = uris[0].rstrip("/"), True
        if f"{suite}-security" in suites and not found_security:
            security, found_security = uris[0].rstrip("/"), True
    return mirror, security


def recipe() -> Recipe:
    """The recipe of the stand-in on this machine."""
    if not CA_BUNDLE.is_file():
        raise BaseUnavailable(f"this machine has no CA bundle at {CA_BUNDLE}")
    mirror, security = host_mirrors()
    return Recipe(
        suite="bookworm",
        variant="minbase",
        packages=("python3", "python3-venv", "python3-pip"),
        mirror=mirror,
        security_mirror=security,
        ca_bundle_sha256=hashlib.sha256(CA_BUNDLE.read_bytes()).hexdigest(),
        image_changes=IMAGE_CHANGES,
        slim=(*SLIM_EXCLUDED, *SLIM_KEPT, SLIM_APT),
    )


def cache_dir() -> Path:
    """Where the tarballs are kept: outside the repository, per user."""
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "graphile-worker-py" / "docker-base"


def _run(args: list[str], timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    """Run a command; a failure raises with its last lines of output."""
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"{what} took more than {timeout:.0f} s: {' '.join(args)}") from exc
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-30:])
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {' '.join(args)}\n{tail}")
    return done


def _deb822_sources(r: Recipe) -> str:
    """The official image's /etc/apt/sources.list.d/debian.sources, on ``r``'s mirrors."""
    return (
        f"Types: deb\nURIs: {r.mirror}\nSuites: {r.suite} {r.suite}-updates\n"
        f"Components: main\nSigned-By: {SIGNED_BY}\n\n"
        f"Types: deb\nURIs: {r.security_mirror}\nSuites: {r.suite}-security\n"
        f"Components: main\nSigned-By: {SIGNED_BY}\n"
    )


def _make_official_like(rootfs: Path, r: Recipe) -> None:
    """Turn debootstrap's tree into the official image's shape (module docstring)."""
    local_bin = rootfs / "usr" / "local" / "bin"
    local_bin.mkdir(parents=True, exist_ok=True)
    for name, target in (("python", "/usr/bin/python3"), ("pip", "/usr/bin/pip3")):
        if not (rootfs / target.lstrip("/")).exists():
            raise RuntimeError(f"debootstrap left no {target} in the root filesystem")
        (local_bin / name).unlink(missing_ok=True)
        (local_bin / name).symlink_to(target)
    markers = list(rootfs.glob("usr/lib/python3*/EXTERNALLY-MANAGED"))
    if not markers:
        raise RuntimeError("Debian's Python has no EXTERNALLY-MANAGED marker to remove")
    for marker in markers:
        marker.unlink()
    (rootfs / "etc/apt/sources.list").unlink(missing_ok=True)
    (rootfs / "etc/apt/sources.list.d").mkdir(parents=True, exist_ok=True)
    (rootfs / "etc/apt/sources.list.d/debian.sources").write_text(_deb822_sources(r))
    shutil.copyfile(CA_BUNDLE, rootfs / CA_BUNDLE.relative_to("/"))
    _make_slim(rootfs)


def _make_slim(rootfs: Path) -> None:
    """What makes Debian's "slim" images slim, here and for later installs: no
    documentation, manual pages or translations (dpkg leaves them out), and no
    apt caches or package lists left in a layer."""
    (rootfs / "etc/dpkg/dpkg.cfg.d/slim-image").write_text(
        "".join(f"path-exclude /{pattern}\n" for pattern in SLIM_EXCLUDED)
        + "".join(f"path-include /{pattern}\n" for pattern in SLIM_KEPT)
    )
    (rootfs / "etc/apt/apt.conf.d/slim-image").write_text(SLIM_APT)
    for path in (rootfs / "usr/share").rglob("*"):
        name = str(path.relative_to(rootfs))  # matched as dpkg does: * spans folders
        if path.is_dir() and not path.is_symlink():
            continue
        if any(fnmatchcase(name, p) for p in SLIM_EXCLUDED) and not any(
            fnmatchcase(name, p) for p in SLIM_KEPT
        ):
            path.unlink()
    for leftover in [
        *(rootfs / "var/lib/apt/lists").glob("*"),
        *(rootfs / "var/cache/apt/archives").glob("*.deb"),
        *(rootfs / "var/cache/apt").glob("*.bin"),
    ]:
        if leftover.is_file():
            leftover.unlink()


def _unmount_below(root: Path) -> None:
    """Unmount what a failed debootstrap may have left mounted inside ``root``
    (its /proc, /sys), so removing the tree cannot reach the host's."""
    prefix = str(root.resolve()) + "/"
    mounts = [
        line.split()[1] for line in Path("/proc/mounts").read_text().splitlines() if line.strip()
    ]
    for mount in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
        subprocess.run(["umount", "-l", mount], capture_output=True, check=False)


def build_tarball(r: Recipe, tarball: Path, log: Callable[[str], None]) -> None:
    """debootstrap the root filesystem, shape it, and write it as ``tarball``."""
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise BaseUnavailable("debootstrap is not installed (apt-get install debootstrap)")
    if os.geteuid() != 0:
        raise BaseUnavailable("building the base image with debootstrap needs root")
    tarball.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="rootfs-", dir=tarball.parent))
    rootfs = work / "rootfs"
    try:
        log(f"debootstrap {r.suite} ({r.variant}, {', '.join(r.packages)}) from {r.mirror}")
        _run(
            [debootstrap, f"--variant={r.variant}", f"--include={','.join(r.packages)}",
             r.suite, str(rootfs), r.mirror],
            timeout=1200,
            what="debootstrap",
        )  # fmt: skip
        _make_official_like(rootfs, r)
        partial = work / "rootfs.tar"
        _run(
            ["tar", "--numeric-owner", "--xattrs", "-C", str(rootfs),
             "--exclude=./proc/*", "--exclude=./sys/*", "--exclude=./dev/*",
             "-cf", str(partial), "."],
            timeout=600,
            what="tar of the root filesystem",
        )  # fmt: skip
        partial.replace(tarball)
    finally:
        _unmount_below(work)
        shutil.rmtree(work, ignore_errors=True)


def _image_label(tag: str) -> str | None:
    """The recipe label of the image ``tag`` ("" if it has none); None if there is no such image."""
    done = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{json .Config.Labels}}", tag],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0:
        return None
    labels = json.loads(done.stdout or "null") or {}
    return str(labels.get(RECIPE_LABEL, ""))


def ensure_base_image(log: Callable[[str], None]) -> str:
    """Make sure ``BASE_TAG`` exists in Docker: the real image if it is there,
    else the stand-in of the current recipe (imported from the cache, built
    first if the cache has none). Returns what was done, for the test's report."""
    label = _image_label(BASE_TAG)
    if label == "":
        return f"{BASE_TAG}: an image that is not a stand-in (the real one?), used as it is"
    r = recipe()
    digest = r.digest()
    if label == digest:
        return f"{BASE_TAG}: stand-in {digest} already imported"
    tarball = cache_dir() / f"python-3.11-slim-bookworm-{digest}.tar"
    started = time.monotonic()
    how = "from the cache"
    if not tarball.is_file():
        build_tarball(r, tarball, log)
        how = f"built in {time.monotonic() - started:.0f} s"
        for stale in tarball.parent.glob("python-3.11-slim-bookworm-*.tar"):
            if stale != tarball:
                stale.unlink()
    log(f"docker import {tarball.name} as {BASE_TAG}")
    changes = [arg for change in (*r.image_changes, f"LABEL {RECIPE_LABEL}={digest}")
               for arg in ("--change", change)]  # fmt: skip
    _run(["docker", "import", *changes, str(tarball), BASE_TAG], timeout=600, what="docker import")
    size = tarball.stat().st_size / 1e6
    return (
        f"{BASE_TAG}: stand-in {digest} ({size:.0f} MB tarball, {how}) imported; "
        f"{time.monotonic() - started:.0f} s in all"
    )
