"""A one-line progress bar on stderr (a line per step when stderr is not a terminal)."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, steps: int, stream: TextIO = sys.stderr, width: int = 30) -> None:
        self.steps = steps
        self.stream = stream
        self.width = width
        self.tty = stream.isatty()
        self.done_steps = 0
        self.label = ""
        self.share = 0.0
        self.started = time.monotonic()
        self._shown = 0.0

    def step(self, label: str) -> None:
        """A new step begins (the previous one, if any, is done)."""
        if self.label:
            self.done_steps += 1
        self.label = label
        if not self.tty:
            print(f"[{self.done_steps + 1}/{self.steps}] {label}", file=self.stream, flush=True)
        self.show(0.0, force=True)

    def show(self, share: float, *, force: bool = False) -> None:
        """How far the current step is (0 to 1); redrawn at most 10 times a second."""
        self.share = share = min(max(share, 0.0), 1.0)
        now = time.monotonic()
        if not self.tty or (not force and now - self._shown < 0.1):
            return
        self._shown = now
        total = min(1.0, (self.done_steps + share) / self.steps)
        filled = round(total * self.width)
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(
            f"\r[{bar}] {total:4.0%} {now - self.started:5.0f}s  {self.label} {share:4.0%}\x1b[K"
        )
        self.stream.flush()

    def note(self, text: str) -> None:
        """A line of its own above the bar."""
        if self.tty:
            self.stream.write("\r\x1b[K")
        print(text, file=self.stream, flush=True)
        self.show(self.share, force=True)

    def close(self) -> None:
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
