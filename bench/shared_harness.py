"""The README's performance table, from the shared side-by-side harness.

Runs the harness (``../shared/bench`` beside this repository, set up with its
``setup.sh``) in alternating rounds: graphile-worker (Node) with batching, and
this worker with ``async def`` and plain ``def`` tasks, each with success lines on
(``BENCH_LOG_SUCCESS=1``, what users run by default) and off. This worker
runs at its defaults (a local queue of 1,000; graphile-worker's batching
variant, as its perfTest, holds 500). Each round runs
every row once, in an order rotated from round to round, after a warm-up
round that is not counted; the table gives
the worker CPU per 1,000 jobs and the jobs/s of each row (min-max over rounds)
and their ratios to graphile-worker in the same round and logging mode.

    python bench/shared_harness.py --rounds 3

``--rows history`` measures the cost of the history instead (the README's
"The cost of history"): graphile-worker with batching, this worker with
``--history off`` and with history on (the default), ``async def`` tasks,
success lines on, with PostgreSQL's CPU and WAL bytes per job too, and the
ratio of history on to history off in the same round:

    python bench/shared_harness.py --rows history --rounds 6 --n 200000

``--rows queue-size`` compares the default local queue (1,000) with 500, on
an empty table or (``--bloat queues``) behind 10,000 named queues locked by
another worker (the README's "Many named queues"); ``--lines off`` turns the
success lines off for every row of these two sets:

    python bench/shared_harness.py --rows queue-size --bloat queues --rounds 5 --n 200000

``--rows queues`` runs each system (both at their defaults) on the empty table
and behind those queues in the same round, for each one's ratio to its own
empty-table rate; ``--rows peers`` runs pgqueuer, procrastinate, Celery and
Dramatiq (on Redis) beside graphile-worker and this worker (20,000 jobs: the
slowest of them takes half a minute):

    python bench/shared_harness.py --rows peers --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "support"))
from benchmark import precompile  # noqa: E402

#: Plain ``def`` versions of the harness's two Python tasks.
DEF_TASKS = {
    "noop.py": "def task(payload, helpers):\n    return None\n",
    "latency.py": "from probe import probe\n\n\ndef task(payload, helpers):\n"
    "    probe(payload['id'])\n",
}

#: (label, harness system, task kind, extra worker arguments, success lines on)
ROWS = [
    ("graphile-worker 0.18, batching, lines on", "graphile-node", None, "", True),
    ("this worker, async def, lines on", "graphile-py", "async", "", True),
    ("this worker, plain def, lines on", "graphile-py", "def", "", True),
    ("graphile-worker 0.18, batching, lines off", "graphile-node", None, "", False),
    ("this worker, async def, lines off", "graphile-py", "async", "", False),
    ("this worker, plain def, lines off", "graphile-py", "def", "", False),
]
#: The cost of the history (``--rows history``), success lines on for all.
HISTORY_ROWS = [
    ("graphile-worker 0.18, batching", "graphile-node", None, "", True),
    ("this worker, `--history off`", "graphile-py", "async", "--history off", True),
    ("this worker, history on (default)", "graphile-py", "async", "", True),
]
#: The local queue's size (``--rows queue-size``): the default against 500
#: (graphile-worker's perfTest's, and ours before); with ``--bloat queues``
#: the README's "Many named queues".
QUEUE_SIZE_ROWS = [
    ("graphile-worker 0.18, batching", "graphile-node", None, "", True),
    (
        "this worker, `--local-queue-size 500`",
        "graphile-py",
        "async",
        "--local-queue-size 500",
        True,
    ),
    ("this worker, default local queue (1,000)", "graphile-py", "async", "", True),
]
#: Behind 10,000 named queues locked by another worker against the empty
#: table, both systems at their defaults (``--rows queues``): the bloat is
#: the row's, so each system's ratio to its own empty-table rate is per round.
QUEUES_ROWS = [
    ("graphile-worker 0.18, batching, empty table", "graphile-node", None, "", True),
    ("this worker, empty table", "graphile-py", "async", "", True),
    ("graphile-worker 0.18, batching, 10,000 locked queues", "graphile-node", None, "", True),
    ("this worker, 10,000 locked queues", "graphile-py", "async", "", True),
]
#: The other job queues a Python team would pick (``--rows peers``), each at
#: concurrency 10 with its own bulk enqueue and worker CLI; Celery and Dramatiq
#: on Redis. Their ratios are to this worker in the same round.
PEER_ROWS = [
    ("graphile-worker 0.18, batching", "graphile-node", None, "", True),
    ("this worker (defaults)", "graphile-py", "async", "", True),
    ("pgqueuer", "pgqueuer", None, "", True),
    ("procrastinate", "procrastinate", None, "", True),
    ("Celery, Redis broker, threads", "celery", None, "", True),
    ("Dramatiq, Redis broker", "dramatiq", None, "", True),
]
#: The harness's BENCH_BLOAT of a row (by label), whatever ``--bloat`` says.
ROW_BLOAT = {label: "queues" for label, *_rest in QUEUES_ROWS if "locked queues" in label}
ROW_SETS = {
    "tax": ROWS,
    "history": HISTORY_ROWS,
    "queue-size": QUEUE_SIZE_ROWS,
    "queues": QUEUES_ROWS,
    "peers": PEER_ROWS,
}

#: The harness variant of each system.
VARIANTS = {
    "graphile-node": "c10-batch",
    "graphile-py": "c10",
    "pgqueuer": "c10",
    "procrastinate": "c10",
    "celery": "c10-threads",
    "dramatiq": "c10",
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-dir", type=Path, default=REPO.parent / "shared" / "bench")
    parser.add_argument(
        "--anchors-dir",
        type=Path,
        # Where the shared harness's setup.sh installs the other queues (its ANCHORS_DIR).
        default=Path(os.environ.get("ANCHORS_DIR") or Path(tempfile.gettempdir(), "anchors")),
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--warmup", type=int, default=1, help="rounds run first and not counted (cold caches)"
    )
    parser.add_argument("--n", type=int, default=20000, help="jobs per drain")
    parser.add_argument("--rows", choices=sorted(ROW_SETS), default="tax", help="what to compare")
    parser.add_argument(
        "--bloat",
        choices=["permafail", "future", "queues"],
        help="the harness's BENCH_BLOAT: rows inserted before the drained jobs",
    )
    parser.add_argument(
        "--lines",
        choices=["on", "off"],
        default="on",
        help="success lines of every row of --rows history and queue-size",
    )
    args = parser.parse_args()
    rows = ROW_SETS[args.rows]
    python = args.anchors_dir / "py" / "venv" / "bin" / "python"
    if not python.exists():
        sys.exit(f"run {args.bench_dir / 'setup.sh'} first ({python} is missing)")
    cli = Path(sys.executable).with_name("graphile-worker")
    precompile(REPO)
    scratch = Path(tempfile.mkdtemp(prefix="gw-harness-"))
    def_tasks = scratch / "def_tasks"
    def_tasks.mkdir()
    for name, text in DEF_TASKS.items():
        (def_tasks / name).write_text(text)
    results = scratch / "results"
    tag = time.strftime("py-tax-%Y%m%dT%H%M%S")
    for round_ in range(-args.warmup, args.rounds):
        order = rows[round_ % len(rows) :] + rows[: round_ % len(rows)]
        for number, row in enumerate(order):
            label, system, kind, extra, lines = row
            if args.rows != "tax":
                lines = args.lines == "on"
            counted = f"round {round_ + 1}/{args.rounds}" if round_ >= 0 else "warm-up"
            print(f"{counted}, {number + 1}/{len(order)}: {label}")
            env = {
                **os.environ,
                "BENCH_RESULTS_DIR": str(results),
                "ANCHORS_DIR": str(args.anchors_dir),
                "GW_PY_CMD": str(cli),
                "GW_PY_VERSION": "this worker",
                "GW_PY_EXTRA": extra,
            }
            bloat = ROW_BLOAT.get(label, "" if args.rows == "queues" else args.bloat)
            if bloat:
                env["BENCH_BLOAT"] = bloat
            else:
                env.pop("BENCH_BLOAT", None)
            if lines:
                env["BENCH_LOG_SUCCESS"] = "1"
            else:
                env.pop("BENCH_LOG_SUCCESS", None)
            if kind == "def":
                env["GW_PY_TASKS_DIR"] = str(def_tasks)
            else:
                env.pop("GW_PY_TASKS_DIR", None)
            row_tag = f"{tag}-{rows.index(row)}-r{round_}"
            command = [str(python), "bench.py", "run", system, "--variants", VARIANTS[system]]
            command += ["--tests", "throughput", "--reps", "1", "--n", str(args.n)]
            subprocess.run(
                [*command, "--tag", row_tag],
                cwd=args.bench_dir,
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
    if args.rows != "tax":
        print(ratio_table(rows, results / "raw", tag, args.rounds, args.rows))
    else:
        print(table(results / "raw", tag, args.rounds))
    print(f"(raw results: {results / 'raw'})")


def repetitions(raw: Path, tag: str) -> dict[tuple[int, int], tuple[dict[str, Any], int]]:
    """Each counted drain of the run ``tag``: (row, round) -> (its figures, jobs)."""
    found = {}
    for path in raw.glob("*.json"):
        doc = json.loads(path.read_text())
        if not doc["tag"].startswith(tag + "-"):
            continue
        row, round_ = doc["tag"][len(tag) + 1 :].split("-r")
        if int(round_) < 0:  # a warm-up round
            continue
        [rep] = doc["result"]["reps"]
        if not rep["ok"]:
            sys.exit(f"{path}: the drain failed")
        found[int(row), int(round_)] = (rep, int(doc["result"]["n"]))
    return found


def table(raw: Path, tag: str, rounds: int) -> str:
    """The Markdown table of every row, from the harness's raw results."""
    figures = {
        key: (rep["worker_cpu_s"] * 1000 / n, rep["jobs_per_s_net"])
        for key, (rep, n) in repetitions(raw, tag).items()
    }
    lines = [
        "| | worker CPU s / 1k jobs | vs graphile-worker | jobs/s | vs graphile-worker |",
        "|---|---|---|---|---|",
    ]
    for index, (label, *_rest, lines_on) in enumerate(ROWS):
        node = 0 if lines_on else len(ROWS) // 2
        cpu = [figures[index, r][0] for r in range(rounds)]
        rate = [figures[index, r][1] for r in range(rounds)]
        cpu_ratio = [figures[index, r][0] / figures[node, r][0] for r in range(rounds)]
        rate_ratio = [figures[index, r][1] / figures[node, r][1] for r in range(rounds)]
        lines.append(
            f"| {label} | {span(cpu, '.3f')} | {span(cpu_ratio, '.2f', 'x')} "
            f"| {span(rate, ',.0f')} | {span(rate_ratio, '.2f', 'x')} |"
        )
    return "\n".join(lines)


#: The ratios of ``ratio_table``: row -> (the row it is divided by, its name).
COMPARISONS: dict[str, dict[int, list[tuple[int, str]]]] = {
    "history": {1: [(0, "Node")], 2: [(0, "Node"), (1, "off")]},
    "queue-size": {1: [(0, "Node")], 2: [(0, "Node"), (1, "500")]},
    "queues": {1: [(0, "Node")], 2: [(0, "its empty")], 3: [(2, "Node"), (1, "its empty")]},
    "peers": {0: [(1, "this worker")], **{row: [(1, "this worker")] for row in range(2, 6)}},
}


def ratio_table(rows: list[Any], raw: Path, tag: str, rounds: int, row_set: str) -> str:
    """Jobs/s (median [min-max]) of each row with its ratios per round to
    other rows (``COMPARISONS``), and per job the worker's and PostgreSQL's
    CPU (medians) and WAL bytes. The database's CPU is PostgreSQL's, and
    Redis's for the systems using it (Celery, Dramatiq)."""
    comparisons = COMPARISONS[row_set]
    found = repetitions(raw, tag)
    lines = [
        "| | jobs/s | worker CPU µs/job | database CPU µs/job | WAL bytes/job |",
        "|---|---|---|---|---|",
    ]
    for index, (label, *_rest) in enumerate(rows):
        reps = [found[index, r] for r in range(rounds)]
        rate = [rep["jobs_per_s_net"] for rep, _ in reps]
        text = f"{statistics.median(rate):,.0f} [{min(rate):,.0f}-{max(rate):,.0f}]"
        ratios = []
        for base, name in comparisons.get(index, []):
            other = [found[base, r][0]["jobs_per_s_net"] for r in range(rounds)]
            ratios.append(_ratio(rate, other, name))
        if ratios:
            text += f" ({'; '.join(ratios)})"
        worker = statistics.median(rep["worker_cpu_s"] * 1e6 / n for rep, n in reps)
        pg = statistics.median(
            (rep["pg_cpu_s"] + rep.get("redis_cpu_s", 0.0)) * 1e6 / n for rep, n in reps
        )
        wal = statistics.median(rep["db_stats_delta"]["wal_bytes"] / n for rep, n in reps)
        lines.append(f"| {label} | {text} | {worker:.1f} | {pg:.1f} | {wal:,.0f} |")
    return "\n".join(lines)


def _ratio(values: list[float], base: list[float], name: str) -> str:
    """``1.00x NAME, 0.90-1.10``: the median and range of the per-round ratios."""
    ratios = [v / b for v, b in zip(values, base, strict=True)]
    return f"{statistics.median(ratios):.2f}x {name}, {min(ratios):.2f}-{max(ratios):.2f}"


def span(values: list[float], spec: str, unit: str = "") -> str:
    """``min-max`` of ``values``."""
    return f"{format(min(values), spec)}-{format(max(values), spec)}{unit}"


if __name__ == "__main__":
    main()
