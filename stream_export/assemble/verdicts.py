"""What the assembler makes of one valid event: accepted, a repeat, a rejection
with its dead-letter reason, or a score for an episode already published."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Final

from stream_export.contract.reasons import DeadLetterReason


class Verdict(Enum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    #: The very same message (same offset) again, after a crash or rebalance.
    REPLAYED = "replayed"


@dataclass(frozen=True, slots=True)
class Rejected:
    """An event that goes to the dead-letter topic, with a machine-readable reason."""

    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class LateScore:
    """A score for an episode already published: ``row`` goes to the scores output
    under ``key`` (its episode and score id)."""

    key: bytes
    row: bytes


LATE: Final = DeadLetterReason.LATE_EVENT
CONFLICT: Final = DeadLetterReason.CONFLICTING_DUPLICATE
#: Part of an open episode's state was removed by the table's window expiry (a
#: backstop that never reaches an episode closing on time; see AssembleSettings).
EXPIRED: Final = DeadLetterReason.STATE_EXPIRED
#: The worker failed on this one message (a bug): it is dead-lettered, not retried.
INTERNAL: Final = DeadLetterReason.INTERNAL_ERROR

Result = Verdict | Rejected | LateScore


def after_close(eid: str, close_offset: int, reason: str | None, offset: int) -> Verdict | Rejected:
    """An event for an episode closed when the partition was at ``close_offset``."""
    if offset <= close_offset:
        return Verdict.REPLAYED
    how = f"truncated: {reason}" if reason else "complete"
    return Rejected(LATE, f"episode {eid!r} was already closed ({how})")
