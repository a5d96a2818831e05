"""What the stages of one pool share, in one object the pool makes and hands
to each: its id, its events, the local queue, the jobs it holds, the fetched
jobs' own timeouts and its stuck jobs. A stage reads or changes what it needs
of it (the fetcher fills the queue and adds to ``held``; the slots take from
the queue and the timeouts; the completer removes from ``held``) instead of
being handed each collection on its own."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..jobs.workflow_state import StepContext
from ..observe.events import Events
from .pipeline.leases import Leases
from .pipeline.local_queue import LocalQueue
from .supervision.stuck import StuckJobs

__all__ = ["PoolState"]


@dataclass(eq=False)
class PoolState:
    """The state one pool's stages share (see the module's docstring)."""

    #: The pool's id (``pool-...``): the lock holder of its jobs.
    id: str
    events: Events
    #: Fetched (locked) jobs waiting for a slot.
    queue: LocalQueue = field(default_factory=LocalQueue)
    #: Ids of the jobs this pool has locked and not yet written back or given
    #: back: queued, running, or with a result waiting to be written.
    held: set[int] = field(default_factory=set)
    #: The own timeouts (seconds) of fetched jobs that have one, by job id:
    #: the fetcher puts them, a slot takes a job's when it starts it.
    timeouts: dict[int, float] = field(default_factory=dict)
    #: What fetched workflow steps' tasks see (helpers.parents), by job id:
    #: the fetcher puts them, a slot takes a job's when it starts it.
    steps: dict[int, StepContext] = field(default_factory=dict)
    #: Running jobs that should have stopped (in the heartbeat, the metrics).
    stuck: StuckJobs = field(default_factory=StuckJobs)
    #: The pool's leases of limits' slots: the fetcher sets them, the local
    #: queue asks them whether a job may start, the slots say when one ended.
    leases: Leases = field(default_factory=Leases)
