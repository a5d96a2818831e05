"""What watches the jobs a pool runs: ``deadlines`` (timeouts and their
grace), ``start_deadlines`` (a job a limit let start starts at once, or not
at all), ``cancel_watch`` (cancel requests reach running jobs), ``stuck``
(jobs that go on past their stop), ``loop_watch`` (an ``async def`` task that
blocks the event loop, named)."""
