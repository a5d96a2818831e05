"""The pipeline a job goes through in a pool, one stage a module or two.

Fetch: ``fetcher`` (one autocommit statement locks a batch), ``limited_fetch``
(the second statement, for jobs under limits), ``already_held`` (jobs this
pool holds already, left out), ``unreadable`` (a batch with a row that cannot
be read). Queue: ``local_queue``. Run: ``slots`` and ``slot`` (N loops; an
``async def`` task inline), ``task_threads`` (plain ``def`` tasks), ``outcome``
(what a run comes to, settled inside the per-job boundary), ``reporter``
(a settled outcome to the completer, the log and the events). Complete:
``completer`` (batches, group commit) and ``result_writer`` (its
statements; a refused value isolated to its job).
"""
