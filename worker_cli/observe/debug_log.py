"""Debug lines about a pool's life, written from its events (``GRAPHILE_LOGGER_DEBUG``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .log_output import debug_logger

if TYPE_CHECKING:
    from .events import EventHandler, Events

__all__ = ["attach_debug_logging"]


def attach_debug_logging(events: Events) -> None:
    """Log the pool's life at debug level (called only when debug is on, so the
    events cost nothing otherwise)."""
    log = debug_logger.debug

    def pool_event(text: str) -> EventHandler:
        def handler(data: dict[str, Any]) -> None:
            pool_id = data["pool"].id
            log("Worker pool %s: %s", pool_id, text, extra={"pool_id": pool_id})

        return handler

    events.on("pool:create", pool_event("connected"))
    events.on("pool:listen:success", pool_event("listening for new jobs"))
    events.on("worker:getJob:empty", pool_event("no runnable job found"))
    events.on("pool:release", pool_event("released its connections"))

    def worker_create(data: dict[str, Any]) -> None:
        worker_id = data["worker_id"]
        log("Worker %s: started", worker_id, extra={"worker_id": worker_id})

    def job_start(data: dict[str, Any]) -> None:
        job, worker_id = data["job"], data["worker_id"]
        log(
            "Worker %s: running job %d (%s, attempt %d/%d)",
            worker_id,
            job.id,
            job.task_identifier,
            job.attempts,
            job.max_attempts,
            extra={
                "worker_id": worker_id,
                "job_id": job.id,
                "task_identifier": job.task_identifier,
                "attempt": job.attempts,
                "max_attempts": job.max_attempts,
            },
        )

    def job_complete(data: dict[str, Any]) -> None:
        job = data["job"]
        log(
            "Job %d (%s): result recorded",
            job.id,
            job.task_identifier,
            extra={"job_id": job.id, "task_identifier": job.task_identifier},
        )

    events.on("worker:create", worker_create)
    events.on("job:start", job_start)
    events.on("job:complete", job_complete)
