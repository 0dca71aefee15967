"""Wait on conditions with a deadline instead of sleeping and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    check: Callable[[], T],
    *,
    timeout: float,
    interval: float = 0.1,
    what: str | Callable[[], str] = "condition",
) -> T:
    """Poll ``check`` until it returns a truthy value; fail with ``what`` on timeout.

    ``what`` may be a callable, evaluated only on failure, so the message can show
    the state at the deadline (what is still missing, the logs' last lines).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            said = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {said}")
        time.sleep(interval)
