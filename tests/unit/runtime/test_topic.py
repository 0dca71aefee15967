"""Topic declarations shared by callers, one of which is cancelled (a stop during
start-up): the others still get the declaration, which ran once."""

from __future__ import annotations

import asyncio

import faust
import pytest

from stream_export import settings
from stream_export.ops.worker import build
from stream_export.runtime.topic import Topic


class Held(Topic):
    """A topic whose declaration waits for ``release`` and counts its runs."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.release = asyncio.Event()
        self.runs = 0

    async def declare(self) -> None:
        self.runs += 1
        await self.release.wait()


async def two_callers_one_cancelled(topic: Held) -> tuple[BaseException | None, int]:
    """The first caller declares, a second waits and is cancelled, then the
    declaration ends: what the first caller got, and how often it ran."""
    first = asyncio.ensure_future(topic.maybe_declare())
    await asyncio.sleep(0.01)
    second = asyncio.ensure_future(topic.maybe_declare())
    await asyncio.sleep(0.01)
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
    topic.release.set()
    done = await asyncio.gather(first, return_exceptions=True)
    return done[0], topic.runs


@pytest.fixture
def app() -> faust.App:
    return faust.App("declare-test", autodiscover=False)


def test_a_cancelled_caller_leaves_the_declaration_to_the_others(app: faust.App) -> None:
    async def run() -> tuple[BaseException | None, int]:
        return await two_callers_one_cancelled(Held(app, topics=["t"]))

    assert asyncio.run(run()) == (None, 1)


def test_faust_own_declaration_crashed_in_that_case(app: faust.App) -> None:
    """Why the class exists: with mode's stampede the first caller fails."""

    class Stock(Held):
        maybe_declare = faust.Topic.maybe_declare

    async def run() -> tuple[BaseException | None, int]:
        return await two_callers_one_cancelled(Stock(app, topics=["t"]))

    error, runs = asyncio.run(run())
    assert isinstance(error, asyncio.InvalidStateError) and runs == 1


def test_a_later_call_declares_again(app: faust.App) -> None:
    async def run() -> int:
        topic = Held(app, topics=["t"])
        topic.release.set()
        await topic.maybe_declare()
        await topic.maybe_declare()
        return topic.runs

    assert asyncio.run(run()) == 2


def test_the_worker_declares_every_topic_with_this_class() -> None:
    app = build(settings.load(env={}, overrides=["groups.enabled=true", "scores.enabled=true"]))
    changelogs = [table.changelog_topic for table in app.tables.values()]
    assert len(changelogs) == 4
    assert all(type(topic) is Topic for topic in [*changelogs, app.topic("any")])
