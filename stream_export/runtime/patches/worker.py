"""Faust's worker patched: the end of a stop without mode's two fixed seconds.

Once every service has stopped, mode's ``Worker._shutdown_loop`` polls every 0.1 s
for up to a second for the loop's last tasks to end, cancels them, then sleeps a
fixed second before it closes the loop. What is left there is mostly mode's own
bare ``Event.wait`` tasks, which never end on their own, so every stop spent both
seconds.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import faust

#: How long the last tasks get to end before they are cancelled, and then to
#: unwind: mode's own bound for each.
LAST_TASKS_S: Final = 1.0


class Worker(faust.Worker):
    """Faust's worker; its loop closes as soon as its last tasks have ended."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        #: The last tasks cancelled at shutdown, awaited before the loop closes.
        self._cancelled: set[asyncio.Task[Any]] = set()

    def _gather_all(self) -> None:
        """Cancel a task that only waits for an event at once; give the others
        mode's second to end, polled every 10 ms, then cancel them."""
        deadline = self.loop.time() + LAST_TASKS_S
        while True:
            left = asyncio.all_tasks(self.loop)
            for task in [t for t in left if _waits_for_an_event(t)]:
                task.cancel()
                self._cancelled.add(task)
            working = left - self._cancelled
            if not working or self.loop.time() >= deadline:
                break
            self.loop.run_until_complete(asyncio.sleep(0.01))
        for task in working:
            task.cancel()
            self._cancelled.add(task)

    async def _sentinel_task(self) -> None:
        """mode sleeps a second here so that the cancelled tasks unwind before the
        loop closes; wait for them to have unwound instead, for no longer."""
        if self._cancelled:
            await asyncio.wait(self._cancelled, timeout=LAST_TASKS_S)
        await asyncio.sleep(0)  # their done callbacks


def _waits_for_an_event(task: asyncio.Task[Any]) -> bool:
    """Whether ``task`` is a bare ``Event.wait()`` (asyncio's or mode's)."""
    return getattr(task.get_coro(), "__qualname__", "") == "Event.wait"
