"""Runs a test's own aiohttp server on an event loop in a thread of its own, so
synchronous tests and fixtures can start it, use it and stop it with a ``with``."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar


class Servable(Protocol):
    async def serve(self, ready: threading.Event, stop: asyncio.Event) -> None: ...


S = TypeVar("S", bound=Servable)


@contextmanager
def in_thread(server: S, name: str) -> Iterator[S]:
    """``server.serve`` on a loop in a daemon thread until the block ends; ``name``
    says which server did not start in time."""
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready = threading.Event()
    thread = threading.Thread(
        target=loop.run_until_complete, args=(server.serve(ready, stop),), daemon=True
    )
    thread.start()
    try:
        assert ready.wait(30), f"{name} did not start"
        yield server
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)
        loop.close()
