"""The control topic folded into its state (pure: the clock is passed in): the
version that serves calls, the open fence, the live replicas and what each one
acknowledged. A trainer's fence client and every gateway replica fold the same
log, so they agree on it."""

from __future__ import annotations

from dataclasses import dataclass, field

from stream_export.contract.calls import WeightVersion, version_key
from stream_export.contract.weights import (
    ACK_PREFIX,
    FENCE_KEY,
    LEASE_PREFIX,
    Ack,
    Begin,
    Commit,
    ControlRecord,
    FenceRecord,
    Lease,
    decode,
)


def newer(version: WeightVersion, than: WeightVersion | None) -> bool:
    """Whether ``version`` comes after ``than`` (None: nothing was committed) in the
    order of weight versions (integers by value, before other strings)."""
    return than is None or version_key(version) > version_key(than)


@dataclass
class ControlState:
    """The latest fence record, each replica's lease and acknowledged fence."""

    fence: FenceRecord | None = None
    leases: dict[str, Lease] = field(default_factory=dict)
    acks: dict[str, str] = field(default_factory=dict)

    def apply(self, key: bytes | None, value: bytes | None) -> ControlRecord | None:
        """Fold one message in; the record it held (None: a tombstone, or not a
        control record, which is ignored: ValueError is the caller's to count)."""
        if value is None:
            name = (key or b"").decode(errors="replace")
            if name.startswith(LEASE_PREFIX):
                self.leases.pop(name.removeprefix(LEASE_PREFIX), None)
            elif name.startswith(ACK_PREFIX):
                self.acks.pop(name.removeprefix(ACK_PREFIX), None)
            return None
        record = decode(value)
        if isinstance(record, Lease):
            self.leases[record.replica] = record
        elif isinstance(record, Ack):
            self.acks[record.replica] = record.fence_id
        elif key == FENCE_KEY:
            self.fence = record
        return record

    @property
    def serving(self) -> WeightVersion | None:
        """The version that serves calls (a Begin's until its commit)."""
        fence = self.fence
        if isinstance(fence, Commit):
            return fence.version
        return fence.serving if fence is not None else None

    @property
    def open_fence(self) -> Begin | None:
        return self.fence if isinstance(self.fence, Begin) else None

    def expired(self, now: float) -> bool:
        """Whether a fence is open past its timeout (its trainer never committed)."""
        fence = self.open_fence
        return fence is not None and now > fence.at + fence.timeout_s

    def live(self, now: float) -> set[str]:
        """The replicas whose lease has not run out."""
        return {r for r, lease in self.leases.items() if lease.at + lease.lease_s > now}

    def unacknowledged(self, fence_id: str, now: float) -> set[str]:
        """The live replicas that have not acknowledged ``fence_id`` yet."""
        return {r for r in self.live(now) if self.acks.get(r) != fence_id}
