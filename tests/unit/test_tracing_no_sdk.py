"""Tracing without an OpenTelemetry SDK (a process of its own: the tests of
test_tracing.py set the process's TracerProvider, which cannot be unset)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit


NO_SDK = """
import asyncio, sys
from datetime import UTC, datetime
from types import SimpleNamespace
from opentelemetry import propagate
from worker_cli.jobs.job import Job
from worker_cli.tasks.loader import Task
from worker_cli.client.trace_context import JobContexts
from worker_cli.observe.otel import JobTracer

seen = {}

async def task(payload, helpers):
    propagate.inject(seen)  # what an instrumented HTTP client would send

now = datetime.now(UTC)
job = Job(1, None, 1, {}, 0, now, 1, 25, None, now, now, None, now, "p", 0, None, False, "t", None)
contexts = JobContexts("graphile_worker")
contexts._carriers[1] = {"traceparent": sys.argv[1]}
traced = JobTracer(contexts).wrap(Task("t", task, True, "t")).function
asyncio.run(traced({}, SimpleNamespace(job=job)))
assert seen == {"traceparent": sys.argv[1]}, seen
"""


def test_without_an_sdk_the_callers_context_passes_through_the_task(tmp_path: Path) -> None:
    """No TracerProvider: spans are no-ops, but what the task sends on still
    carries the trace of the code that added the job."""
    script = tmp_path / "no_sdk.py"
    script.write_text(NO_SDK)
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    result = subprocess.run(
        [sys.executable, str(script), traceparent],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
