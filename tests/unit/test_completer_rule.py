"""When the completer writes results at once instead of letting a batch grow."""

from __future__ import annotations

import pytest

from worker_cli.worker.pipeline.completer import WRITE_AT_MOST, write_now

pytestmark = pytest.mark.unit

BUSY = {"stopping": False, "named_queue_results": 0, "pool_idle": False, "pending": 5}


def test_a_busy_pool_lets_the_batch_grow() -> None:
    assert not write_now(**BUSY)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "change",
    [
        {"stopping": True},  # shutting down: nothing should wait
        {"named_queue_results": 1},  # the job's named queue stays locked until written
        {"pool_idle": True},  # nothing else will join the batch
        {"pending": WRITE_AT_MOST},  # a bounded statement, bounded loss in a crash
    ],
)
def test_each_reason_to_write_now(change: dict[str, object]) -> None:
    assert write_now(**{**BUSY, **change})  # type: ignore[arg-type]


def test_a_large_batch_is_written_only_from_the_limit() -> None:
    assert not write_now(**{**BUSY, "pending": WRITE_AT_MOST - 1})  # type: ignore[arg-type]
