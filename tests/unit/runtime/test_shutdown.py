"""The stop budget: a stopping worker's waits for the broker share STOP_BUDGET_S,
and a stage's last persist gives up within it."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

import pytest

from stream_export.runtime.shutdown import STOP_BUDGET_S, drained, stop_wait


@dataclass(eq=False)
class App:
    should_stop: bool = False


def test_waits_share_the_budget_from_the_first_wait_at_stop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    monkeypatch.setattr("stream_export.runtime.shutdown.time.monotonic", lambda: now[0])
    app, other = App(), App(should_stop=True)
    assert stop_wait(app, 3.0) == 3.0  # running: each wait its own bound
    now[0] += 60
    assert stop_wait(app, 3.0) == 3.0  # and the budget has not started
    app.should_stop = True
    assert stop_wait(app, 2.0) == 2.0  # the first wait at stop starts it
    now[0] += 2.0
    assert stop_wait(app, 3.0) == STOP_BUDGET_S - 2.0
    now[0] += STOP_BUDGET_S
    assert stop_wait(app, 3.0) == 0.0  # spent: give up at once
    assert stop_wait(other, 3.0) == 3.0  # another app has a budget of its own


def test_a_stage_drain_gives_up_only_once_the_app_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("stream_export.runtime.shutdown.STOP_FLUSH_TIMEOUT_S", 0.05)
    done: list[str] = []

    async def deliver() -> None:
        done.append("deliver")

    async def persist() -> None:  # a delivery the broker never acknowledges
        await asyncio.sleep(0.2 if app.should_stop else 0.0)
        done.append("persist")

    app = App()
    assert asyncio.run(drained(app, "groups", deliver, persist))
    app.should_stop = True
    began = time.monotonic()
    assert not asyncio.run(drained(app, "groups", deliver, persist))
    assert time.monotonic() - began < 0.15
    assert done == ["deliver", "persist", "deliver"]
