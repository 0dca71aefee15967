"""The live loop trainer's ledger: which group records each weight version trained
on, so that a record delivered again (a crash after the step, before the feed's
acknowledgement) is never trained twice, and what the rollouts scored under the
version that served them (the learning curve).

One JSON line per step, appended and fsync'd before the step's weights are loaded
and its batch acknowledged::

    {"version": 3, "records": ["g1", ...], "stepped": true, "staleness": 1,
     "rollouts": [[2, 1.0], [2, 0.0], ...]}

``version`` is the weights' version after the step (the one before when nothing was
stepped: every record was empty); ``rollouts`` holds each rollout's (oldest serving
version, reward). A torn last line (a crash while writing it) is ignored: its step's
checkpoint carries the same entry (``trained.json``) and is appended again.
Standard library only.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain
from pathlib import Path
from typing import Any


@dataclass
class Ledger:
    path: Path
    entries: list[dict[str, Any]] = field(default_factory=list)
    trained: set[str] = field(default_factory=set)

    @classmethod
    def open(cls, path: str | Path) -> Ledger:
        ledger = cls(Path(path))
        if ledger.path.exists():
            for line in ledger.path.read_text().splitlines():
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue  # the torn tail of a crash
                ledger._add(entry)
        return ledger

    def _add(self, entry: dict[str, Any]) -> None:
        self.entries.append(entry)
        self.trained.update(entry["records"])

    @property
    def version(self) -> int:
        """The last entry's version (0: none yet)."""
        return int(self.entries[-1]["version"]) if self.entries else 0

    def append(self, entry: dict[str, Any]) -> None:
        """Write ``entry`` durably (fsync) and remember its records as trained."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as out:
            out.write(json.dumps(entry, separators=(",", ":")) + "\n")
            out.flush()
            os.fsync(out.fileno())
        self._add(entry)

    def curve(self) -> dict[int, tuple[float, int]]:
        """Mean reward and rollout count by the version that served the rollouts."""
        return reward_curve(r for e in self.entries for r in e["rollouts"])

    def reached(
        self, target: float, window: int, pending: Iterable[tuple[int, float] | list[Any]] = ()
    ) -> bool:
        """Whether the rollouts one version served, with ``pending`` ones (a batch not
        appended yet), reach ``target`` mean reward over at least ``window`` of them."""
        served = chain((r for e in self.entries for r in e["rollouts"]), pending)
        return any(
            count >= window and mean >= target for mean, count in reward_curve(served).values()
        )


def reward_curve(rollouts: Iterable[tuple[int, float] | list[Any]]) -> dict[int, tuple[float, int]]:
    """(serving version, reward) pairs -> version: (mean reward, count), by version."""
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0])
    for version, reward in rollouts:
        sums[int(version)][0] += reward
        sums[int(version)][1] += 1
    return {v: (total / count, int(count)) for v, (total, count) in sorted(sums.items())}
