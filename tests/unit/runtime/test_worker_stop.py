"""The end of a worker's stop: once its services have stopped, the tasks left on the
event loop get mode's bound (1 s) to end, are cancelled after it and unwound before
the loop closes; tasks that only wait for an event are not waited for, and mode's
fixed second after the cancel is gone (every stop of every worker paid both)."""

from __future__ import annotations

import asyncio
import faulthandler
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

from stream_export.ops.worker import Worker, build
from stream_export.runtime.patches.worker import LAST_TASKS_S
from stream_export.settings import load


def shut_down_with(
    tmp_path: Path, *coros: Coroutine[Any, Any, object]
) -> tuple[float, list[asyncio.Task[object]]]:
    """Leave ``coros`` as tasks on a worker's loop, run its stop and shutdown: the
    seconds it took and the tasks."""
    settings = load(env={}, overrides=[f"worker.data_dir={tmp_path}", "worker.store=memory://"])
    loop = asyncio.new_event_loop()
    worker = Worker(build(settings), loop=loop, quiet=True, stop_deadline_s=60)

    async def leave() -> list[asyncio.Task[object]]:
        tasks = [loop.create_task(coro) for coro in coros]
        await asyncio.sleep(0)
        return tasks

    tasks = loop.run_until_complete(leave())
    began = time.monotonic()
    try:
        worker.stop_and_shutdown()
    finally:
        faulthandler.cancel_dump_traceback_later()
    assert loop.is_closed()
    return time.monotonic() - began, tasks


def test_waits_for_events_are_cancelled_at_once_and_work_still_finishes(tmp_path: Path) -> None:
    async def working() -> None:  # still doing something: it may finish
        await asyncio.sleep(0.2)

    # What mode leaves behind: bare waits for events that never come.
    took, (parked, parked_too, worked) = shut_down_with(
        tmp_path, asyncio.Event().wait(), asyncio.Event().wait(), working()
    )
    assert parked.cancelled() and parked_too.cancelled()
    assert worked.done() and not worked.cancelled()
    # mode waited out the whole bound for the parked tasks, then slept 1 s more.
    assert took < LAST_TASKS_S, took


def test_a_task_still_working_at_the_bound_is_cancelled_and_unwound(tmp_path: Path) -> None:
    seen: list[str] = []

    async def stuck() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.05)
            seen.append("stuck unwound")

    took, (task,) = shut_down_with(tmp_path, stuck())
    assert took >= LAST_TASKS_S
    assert task.cancelled() and seen == ["stuck unwound"]
