"""Stop the worker on purpose: one clear log line, a clean stop, exit code 2.

An exception raised inside Faust's services is logged as a crash with a
traceback, which buries what an operator must do. For a condition the operator
has to resolve (a topic reset, say), :func:`stop` logs the error as one line,
remembers it, and asks the worker to stop the way an operator would (SIGTERM:
Faust's clean shutdown); :func:`stream_export.ops.worker.run` then exits with 2, like
the command line's other errors. One worker per process, so the state is the
process's.

Whatever stops it, a stopping worker waits for the broker in turn: the stages'
last persists, Faust's last commit, its producer's flush and stop. Each wait is
bounded, and :func:`stop_wait` makes them share one budget, so that without the
broker the worker still exits within the README's bound however many there are.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol

from stream_export.errors import StreamExportError
from stream_export.kafka.connection import STOP_FLUSH_TIMEOUT_S

log = logging.getLogger(__name__)

_errors: list[StreamExportError] = []


class _Service(Protocol):
    @property
    def should_stop(self) -> bool: ...


#: Once a worker stops, its waits for the broker end within this many seconds of the
#: first of them, between them all. Giving up loses nothing: what a wait covered is
#: not acknowledged, and a restart handles it again.
STOP_BUDGET_S: Final = 5.0
#: Per stopping app, when its first wait at stop began (monotonic).
_stopping: weakref.WeakKeyDictionary[_Service, float] = weakref.WeakKeyDictionary()


def stop(error: StreamExportError) -> None:
    """Log ``error`` and stop this worker; later calls (another table, say, while
    it stops) only log at info level, so the reason stays one error line."""
    if _errors:
        log.info("stream-export: also %s", error)
        return
    log.error("stream-export: %s", error)
    _errors.append(error)
    os.kill(os.getpid(), signal.SIGTERM)


def reason() -> StreamExportError | None:
    """The error the worker was stopped for, if any."""
    return _errors[0] if _errors else None


def stop_wait(app: _Service, bound: float) -> float:
    """How long a wait of ``app`` may take: ``bound``, and once it stops, no more than
    what is left of STOP_BUDGET_S (0: give up at once)."""
    if not app.should_stop:
        return bound
    began = _stopping.setdefault(app, time.monotonic())
    return max(0.0, min(bound, began + STOP_BUDGET_S - time.monotonic()))


async def drained(app: _Service, stage: str, *steps: Callable[[], Awaitable[None]]) -> bool:
    """Run a stage's ``steps`` (its last deliveries and persist) in turn; once ``app``
    stops, give up after STOP_FLUSH_TIMEOUT_S or when the budget is spent (without
    the broker nothing is delivered). Whether they all completed: what they did not
    acknowledge is handled again on restart."""
    bound = stop_wait(app, STOP_FLUSH_TIMEOUT_S) if app.should_stop else None
    try:
        async with asyncio.timeout(bound):
            for step in steps:
                await step()
    except TimeoutError:
        log.warning("%s: the last persist gave up after %.0fs", stage, bound)
        return False
    return True


async def bounded(app: Any, step: Awaitable[None], gave_up: str) -> None:
    """Await ``step`` for at most STOP_FLUSH_TIMEOUT_S within the stop budget
    (stop_wait); past that, log ``gave_up`` (its ``%.0f``: the bound)."""
    bound = stop_wait(app, STOP_FLUSH_TIMEOUT_S)
    try:
        async with asyncio.timeout(bound):
            await step
    except TimeoutError:
        log.warning(gave_up, bound)
