"""Is a topic still the one whose offsets we kept? Pure decisions, no I/O.

The sink's checkpoint and the assembler's local table state both remember
Kafka offsets. When the broker's data is wiped (a Kafka container without a
volume) or a topic is deleted and created again, those offsets point into a
topic that no longer exists: resuming at them would skip every record of the new
topic up to there, silently. Two signals tell it:

- the topic id changed (Kafka 2.8+ gives every topic an id; a recreated topic
  gets a new one even when its name and partitions are the same);
- an offset already handled is at or beyond the partition's end offset (a log
  never shrinks: only a new log is shorter than what was read of the old one),
  or the partition no longer exists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

#: What a worker does when it finds a reset (``sink.on_topic_reset``).
Policy = Literal["stop", "new_epoch"]
STOP: Final = "stop"
NEW_EPOCH: Final = "new_epoch"


@dataclass(frozen=True)
class TopicReset:
    """Why ``topic`` is not the topic the offsets were kept for."""

    topic: str
    #: "topic_id" or "offsets".
    cause: str
    detail: str

    def explain(self, kept: str, remedy: str) -> str:
        """One line for the operator: what was kept, what was found, what to do."""
        return (
            f"{kept} is for an earlier incarnation of topic {self.topic!r}: {self.detail} "
            f"(the broker's data was wiped, or the topic deleted and created again); {remedy}"
        )

    def __str__(self) -> str:
        return f"topic {self.topic!r} was reset: {self.detail}"


def behind(done: Mapping[int, int], ends: Mapping[int, int]) -> dict[int, int | None]:
    """Partitions whose last handled offset the topic does not have, with their end
    offset now (None: the partition is gone)."""
    out: dict[int, int | None] = {}
    for partition, offset in sorted(done.items()):
        end = ends.get(partition)
        if end is None or offset >= end:
            out[partition] = end
    return out


def detect(
    topic: str,
    *,
    done: Mapping[int, int],
    ends: Mapping[int, int],
    known_id: str | None = None,
    current_id: str | None = None,
) -> TopicReset | None:
    """The reset of ``topic`` since ``done`` (last handled offset per partition) was
    recorded under ``known_id``, given its ``ends`` and ``current_id`` now; None if
    it is the same topic. An unknown id (None) on either side is not evidence."""
    if known_id and current_id and known_id != current_id:
        return TopicReset(
            topic, "topic_id", f"its topic id changed from {known_id} to {current_id}"
        )
    lost = behind(done, ends)
    if not lost:
        return None
    parts = [
        f"partition {p} has no offset {done[p]}"
        + (" (it is gone)" if end is None else f" (it ends at {end})")
        for p, end in lost.items()
    ]
    shown = "; ".join(parts[:3]) + (f"; {len(parts) - 3} more" if len(parts) > 3 else "")
    return TopicReset(topic, "offsets", f"offsets already handled are past its end: {shown}")
