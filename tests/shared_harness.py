"""The README's performance table, from the shared side-by-side harness.

Runs the harness (``../shared/bench`` beside this repository, set up with its
``setup.sh``) in alternating rounds: graphile-worker (Node) with batching, and
this worker with ``async def`` and plain ``def`` tasks, each with success lines on
(``BENCH_LOG_SUCCESS=1``, what users run by default) and off. This worker
runs at its defaults: its local queue of 500 is the size of graphile-worker's
batching variant. Each round runs
every row once, in an order rotated from round to round, after a warm-up
round that is not counted; the table gives
the worker CPU per 1,000 jobs and the jobs/s of each row (min-max over rounds)
and their ratios to graphile-worker in the same round and logging mode.

    python tests/shared_harness.py --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
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
#: The harness variant of each system.
VARIANTS = {"graphile-node": "c10-batch", "graphile-py": "c10"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench-dir", type=Path, default=REPO.parent / "shared" / "bench")
    parser.add_argument("--anchors-dir", type=Path, default=Path("/tmp/anchors"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--warmup", type=int, default=1, help="rounds run first and not counted (cold caches)"
    )
    parser.add_argument("--n", type=int, default=20000, help="jobs per drain")
    args = parser.parse_args()
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
        order = ROWS[round_ % len(ROWS) :] + ROWS[: round_ % len(ROWS)]
        for number, row in enumerate(order):
            label, system, kind, extra, lines = row
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
            if lines:
                env["BENCH_LOG_SUCCESS"] = "1"
            else:
                env.pop("BENCH_LOG_SUCCESS", None)
            if kind == "def":
                env["GW_PY_TASKS_DIR"] = str(def_tasks)
            else:
                env.pop("GW_PY_TASKS_DIR", None)
            row_tag = f"{tag}-{ROWS.index(row)}-r{round_}"
            command = [str(python), "bench.py", "run", system, "--variants", VARIANTS[system]]
            command += ["--tests", "throughput", "--reps", "1", "--n", str(args.n)]
            subprocess.run(
                [*command, "--tag", row_tag],
                cwd=args.bench_dir,
                env=env,
                check=True,
                stdout=subprocess.DEVNULL,
            )
    print(table(results / "raw", tag, args.rounds))
    print(f"(raw results: {results / 'raw'})")


def table(raw: Path, tag: str, rounds: int) -> str:
    """The Markdown table of every row, from the harness's raw results."""
    figures: dict[tuple[int, int], tuple[float, float]] = {}
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
        cpu = rep["worker_cpu_s"] * 1000 / doc["result"]["n"]
        figures[int(row), int(round_)] = (cpu, rep["jobs_per_s_net"])
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


def span(values: list[float], spec: str, unit: str = "") -> str:
    """``min-max`` of ``values``."""
    return f"{format(min(values), spec)}-{format(max(values), spec)}{unit}"


if __name__ == "__main__":
    main()
