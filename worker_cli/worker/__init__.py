"""The worker: a pool that fetches jobs, runs them and writes back the results.

(Being split into its parts; see ``pool.py``.)
"""

from __future__ import annotations

from .pool import WorkerPool

__all__ = ["WorkerPool"]
