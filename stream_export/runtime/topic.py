"""Faust's topic, with a declaration that a caller stopping cannot break."""

from __future__ import annotations

import asyncio

import faust


class Topic(faust.Topic):
    """``maybe_declare`` runs one declaration at a time, in a task of its own that
    each caller awaits shielded.

    Faust's is mode's ``stampede``: its callers share a future, and a caller
    cancelled while it waits (the conductor's task, when the worker stops during
    start-up) cancels that future; the caller running the declaration then cannot
    set its result and crashed the worker with ``InvalidStateError``: a traceback
    and exit code 1 for a plain SIGTERM.
    """

    _declaring: asyncio.Future[None] | None = None

    async def maybe_declare(self) -> None:
        task = self._declaring
        if task is None or task.done():
            task = self._declaring = asyncio.ensure_future(self.declare())
            # Retrieved here too: a failure every caller stopped waiting for is
            # not logged as never retrieved (the next caller declares again).
            task.add_done_callback(lambda t: t.cancelled() or t.exception())
        await asyncio.shield(task)
