"""The errors a job's ``last_error`` holds.

A job keeps one error (graphile-worker's ``last_error``; the history copies it
once, when the job finishes): each failed attempt's error replaces the one
before. An admin's permanent failure (``graphile-worker fail``, the
dashboard's "Permanently fail") keeps the error it replaces, as
``REASON (was: ERROR)`` (:mod:`worker_cli.sql.admin`), so a job
failed by hand after being retried by hand holds them nested:
``REASON (was: REASON (was: ERROR))``. :func:`error_chain` takes them apart,
newest first, for the job's page (which shows the text as stored too).
"""

from __future__ import annotations

__all__ = ["error_chain"]

#: What the fail statement puts between a reason and the error it keeps.
WAS = " (was: "


def error_chain(text: str | None) -> list[str]:
    """The reasons and errors ``text`` holds, newest first: ``["REASON",
    "ERROR"]`` for ``REASON (was: ERROR)``; ``[text]`` for a plain error, ``[]``
    for none."""
    if not text:
        return []
    chain = []
    while True:
        head, was, rest = text.partition(WAS)
        if not was or not rest.endswith(")"):
            chain.append(text)
            return chain
        chain.append(head)
        text = rest[:-1]
