"""The judge's tasks (groups/judging.py) against the worker's lifecycle: what is in
flight when the worker stops or partitions move is cancelled, never left to die
with the event loop."""

from __future__ import annotations

import asyncio

from stream_export import config
from stream_export.groups.judging import JudgeTasks
from stream_export.groups.state import OpenGroup
from stream_export.runtime.metrics import Metrics


def _tasks(waiting: asyncio.Event, cancelled: list[int]) -> JudgeTasks:
    """Tasks whose verdicts are never delivered: each waits in its post."""

    async def post(partition: int, key: bytes, value: bytes, headers: object) -> None:
        waiting.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(partition)
            raise

    settings = config.load(
        env={},
        overrides=[
            "groups.enabled=true",
            "groups.judge_url=http://judge:8000/v1",
            "groups.judge_model=j",
            "scores.enabled=true",
        ],
    )
    return JudgeTasks(settings, Metrics(), post)


async def test_a_stopping_worker_cancels_the_judge_calls_in_flight() -> None:
    waiting, cancelled = asyncio.Event(), []
    judges = _tasks(waiting, cancelled)
    held = asyncio.create_task(judges.run())
    judges.start(3, OpenGroup(group_id="g", opened=0.0, expected=2))  # no member: no call
    async with asyncio.timeout(5):
        await waiting.wait()
    (task,) = judges.tasks.values()
    held.cancel()  # what Faust does to its tasks when the worker stops
    async with asyncio.timeout(5):
        await asyncio.gather(held, task, return_exceptions=True)
    assert task.cancelled() and cancelled == [3]
    assert judges.tasks == {}


async def test_revoked_partitions_lose_their_judge_tasks_and_kept_ones_do_not() -> None:
    waiting, cancelled = asyncio.Event(), []
    judges = _tasks(waiting, cancelled)
    for partition in (1, 2):
        judges.start(partition, OpenGroup(group_id=f"g{partition}", opened=0.0, expected=2))
    async with asyncio.timeout(5):
        while len(judges.tasks) < 2 or not waiting.is_set():
            await asyncio.sleep(0.01)
    judges.keep([2])
    async with asyncio.timeout(5):
        while len(judges.tasks) > 1:
            await asyncio.sleep(0.01)
    assert cancelled == [1] and list(judges.tasks) == [(2, "g2")]
    judges.keep([])
    async with asyncio.timeout(5):
        while judges.tasks:
            await asyncio.sleep(0.01)
    assert cancelled == [1, 2]
