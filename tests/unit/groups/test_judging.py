"""The judge's tasks (groups/judging.py) against the worker's lifecycle: what is in
flight when the worker stops or partitions move is cancelled, never left to die
with the event loop."""

from __future__ import annotations

import asyncio

from stream_export.groups.judging import JudgeTasks
from stream_export.groups.state import OpenGroup
from stream_export.runtime.metrics import Metrics
from stream_export.settings import load


def _tasks(posted: asyncio.Queue[int], cancelled: list[int]) -> JudgeTasks:
    """Tasks whose verdicts are never delivered: each waits in its post."""

    async def post(partition: int, key: bytes, value: bytes, headers: object) -> None:
        posted.put_nowait(partition)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(partition)
            raise

    settings = load(
        env={},
        overrides=[
            "groups.enabled=true",
            "groups.judge_url=http://judge:8000/v1",
            "groups.judge_model=j",
            "scores.enabled=true",
        ],
    )
    return JudgeTasks(settings, Metrics(), post)


def _group(name: str) -> OpenGroup:
    return OpenGroup(group_id=name, opened=0.0, expected=2)  # no member: no judge call


async def test_a_stopping_worker_cancels_the_judge_calls_in_flight() -> None:
    posted: asyncio.Queue[int] = asyncio.Queue()
    cancelled: list[int] = []
    judges = _tasks(posted, cancelled)
    held = asyncio.create_task(judges.run())
    judges.start(3, _group("g"))
    async with asyncio.timeout(5):
        assert await posted.get() == 3
    (task,) = judges.tasks.values()
    held.cancel()  # what Faust does to its tasks when the worker stops
    async with asyncio.timeout(5):
        await asyncio.gather(held, task, return_exceptions=True)
    assert task.cancelled() and cancelled == [3]
    assert judges.tasks == {}


async def test_revoked_partitions_lose_their_judge_tasks_and_kept_ones_do_not() -> None:
    posted: asyncio.Queue[int] = asyncio.Queue()
    cancelled: list[int] = []
    judges = _tasks(posted, cancelled)
    for partition in (1, 2):
        judges.start(partition, _group(f"g{partition}"))
    async with asyncio.timeout(5):
        assert {await posted.get(), await posted.get()} == {1, 2}
    first, second = judges.tasks[1, "g1"], judges.tasks[2, "g2"]
    judges.keep([2])
    async with asyncio.timeout(5):
        await asyncio.gather(first, return_exceptions=True)
    assert first.cancelled() and not second.done()
    assert cancelled == [1] and list(judges.tasks) == [(2, "g2")]
    judges.keep([])
    async with asyncio.timeout(5):
        await asyncio.gather(second, return_exceptions=True)
    assert second.cancelled() and cancelled == [1, 2] and judges.tasks == {}
