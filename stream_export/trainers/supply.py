"""Items from the feed's batches for an adapter that takes them one at a time, and
which batches to acknowledge once the trainer has stepped on them.

A batch is anything with ``items`` and ``ack()`` (the feed's ``Batch``; any iterable
of them, a ``Feed`` itself). A batch is *handed out* once its last item was taken (at
once when it has none: every message in it was skipped); the adapter acknowledges the
batches handed out before the step that trained on them, never earlier, so a crash
before the step redelivers them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Any, Protocol


class BatchLike(Protocol):
    items: list[Any]

    def ack(self) -> None: ...


class Supply:
    def __init__(self, batches: Iterable[BatchLike]) -> None:
        self._batches = iter(batches)
        self._items: deque[Any] = deque()
        self._current: BatchLike | None = None
        self._handed_out: list[BatchLike] = []

    def take(self) -> Any:
        """The next item; StopIteration when the batches end."""
        while not self._items:
            self._finish()
            self._current = next(self._batches)
            self._items.extend(self._current.items)
        item = self._items.popleft()
        if not self._items:
            self._finish()
        return item

    def _finish(self) -> None:
        if self._current is not None:
            self._handed_out.append(self._current)
            self._current = None

    def handed_out(self) -> list[BatchLike]:
        """The batches handed out since the last call (oldest first)."""
        done, self._handed_out = self._handed_out, []
        return done
