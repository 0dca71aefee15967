"""The adapter's consumer thread on its way out."""

from __future__ import annotations

import asyncio

from mode.utils.locks import Event

from stream_export.runtime.patches.consumer import _ConsumerThread


def _thread(loop: asyncio.AbstractEventLoop) -> _ConsumerThread:
    """Just what mode's ``_stopped_set`` reads: the thread's loop and its flag."""
    thread = _ConsumerThread.__new__(_ConsumerThread)
    thread.thread_loop = loop
    thread._stopped = Event()
    return thread


def test_the_consumer_thread_stops_after_its_loop_closed() -> None:
    """mode sets the stopped flag through the thread's own loop; once that loop has
    closed (the thread ended first), the worker's stop must not raise
    "Event loop is closed" (a traceback in the log of a worker stopping cleanly)."""
    loop = asyncio.new_event_loop()
    loop.close()
    thread = _thread(loop)
    thread._stopped_set()  # RuntimeError without the guard
    assert not thread._stopped.is_set()


def test_a_running_loop_still_gets_the_flag() -> None:
    loop = asyncio.new_event_loop()
    try:
        thread = _thread(loop)
        thread._stopped_set()
        loop.run_until_complete(asyncio.sleep(0))
        assert thread._stopped.is_set()
    finally:
        loop.close()
