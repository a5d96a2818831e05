"""The errors a task run in a worker process (``process=True``) may raise come
back to the worker as they were raised: same type, message and attributes
(a retry policy or ``on_failure`` reads them there)."""

from __future__ import annotations

import pickle

import pytest

from worker_cli import (
    Cancel,
    HelperUnavailable,
    JobCancelled,
    JobTimeout,
    ProcessDied,
    Snooze,
)

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "error",
    [
        HelperUnavailable("query", ("job", "logger")),
        ProcessDied("the worker process (pid 7) running the job exited with code 3"),
        JobTimeout(3),
        JobCancelled("no longer wanted"),
        Snooze(60),
        Cancel("not worth it"),
    ],
    ids=type,
)
def test_an_error_unpickles_as_it_was_raised(error: BaseException) -> None:
    again = pickle.loads(pickle.dumps(error))
    assert type(again) is type(error)
    assert str(again) == str(error)
    assert vars(again) == vars(error)


def test_helper_unavailable_names_the_helper_and_the_ones_there_are() -> None:
    error = pickle.loads(pickle.dumps(HelperUnavailable("query", ("job", "logger"))))
    assert isinstance(error, AttributeError)
    assert str(error).startswith(
        "helpers.query is not available to a task run in a worker process (process=True): "
        "it has helpers.job, helpers.logger;"
    )
    assert (error.helper, error.available) == ("query", ("job", "logger"))
