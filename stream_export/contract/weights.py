"""The weight-fence control topic's records: what a trainer and the gateway replicas
tell each other about the policy version that serves calls.

The topic is compacted and has one partition, so its log is one total order and
its latest record per key is the state: ``fence`` holds the latest ``begin``,
``commit`` or ``abort`` (which says the version that serves calls, and whether a
fence is open); ``lease/<replica>`` holds each gateway replica's latest lease
(a tombstone when it stops cleanly); ``ack/<replica>`` its latest acknowledgement
of a fence. Pure types (no I/O); JSON, one record per message.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from stream_export.contract.calls import WeightVersion

#: The key of the fence's record (begin, commit, abort).
FENCE_KEY: Final = b"fence"
LEASE_PREFIX: Final = "lease/"
ACK_PREFIX: Final = "ack/"
Replica = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
FenceId = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
Seconds = Annotated[float, msgspec.Meta(gt=0, le=86_400)]


class Begin(msgspec.Struct, tag="begin", kw_only=True, forbid_unknown_fields=False):
    """A trainer is about to load ``version``: replicas hold new calls, let the ones
    in flight finish under ``serving``, then acknowledge."""

    fence_id: FenceId
    version: WeightVersion
    #: The version that served calls until now (None: none was ever committed).
    serving: WeightVersion | None
    #: Wall-clock time of the begin (seconds since the epoch).
    at: float
    #: The fence expires ``timeout_s`` after ``at`` without a commit or an abort.
    timeout_s: Seconds


class Commit(msgspec.Struct, tag="commit", kw_only=True, forbid_unknown_fields=False):
    """``version`` is loaded: calls flow again, stamped with it."""

    fence_id: FenceId
    version: WeightVersion
    at: float


class Abort(msgspec.Struct, tag="abort", kw_only=True, forbid_unknown_fields=False):
    """The fence is given up: ``serving`` still serves calls (nothing was loaded)."""

    fence_id: FenceId
    serving: WeightVersion | None
    at: float
    reason: Annotated[str, msgspec.Meta(max_length=1024)] = ""


class Lease(msgspec.Struct, tag="lease", kw_only=True, forbid_unknown_fields=False):
    """A gateway replica is alive until ``at + lease_s`` unless it renews."""

    replica: Replica
    at: float
    lease_s: Seconds


class Ack(msgspec.Struct, tag="ack", kw_only=True, forbid_unknown_fields=False):
    """A replica holds new calls for ``fence_id`` and has none in flight."""

    replica: Replica
    fence_id: FenceId
    at: float


FenceRecord = Begin | Commit | Abort
ControlRecord = Begin | Commit | Abort | Lease | Ack

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(ControlRecord)


def encode(record: ControlRecord) -> bytes:
    return _encoder.encode(record)


def decode(value: bytes) -> ControlRecord:
    """A control record; msgspec.DecodeError (a ValueError) when it is not one."""
    return _decoder.decode(value)


def key_of(record: ControlRecord) -> bytes:
    """The compaction key a record is published under."""
    if isinstance(record, Lease):
        return (LEASE_PREFIX + record.replica).encode()
    if isinstance(record, Ack):
        return (ACK_PREFIX + record.replica).encode()
    return FENCE_KEY
