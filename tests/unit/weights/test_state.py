"""The control topic folded into its state: the version serving, the open fence and
its expiry, live replicas and their acknowledgements; bad bytes are refused with a
ValueError and change nothing."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from stream_export.contract.weights import (
    FENCE_KEY,
    Abort,
    Ack,
    Begin,
    Commit,
    ControlRecord,
    Lease,
    encode,
    key_of,
)
from stream_export.weights.state import ControlState, newer


def fold(*records: ControlRecord) -> ControlState:
    state = ControlState()
    for record in records:
        state.apply(key_of(record), encode(record))
    return state


BEGIN = Begin(fence_id="f1", version=2, serving=1, at=100.0, timeout_s=10.0)


def test_the_serving_version_is_the_commits_and_a_begins_previous_one_until_then() -> None:
    assert fold().serving is None
    assert fold(BEGIN).serving == 1
    assert fold(BEGIN).open_fence == BEGIN
    committed = fold(BEGIN, Commit(fence_id="f1", version=2, at=101.0))
    assert committed.serving == 2
    assert committed.open_fence is None
    aborted = fold(BEGIN, Abort(fence_id="f1", serving=1, at=101.0))
    assert (aborted.serving, aborted.open_fence) == (1, None)


def test_a_fence_expires_after_its_timeout_and_only_while_open() -> None:
    state = fold(BEGIN)
    assert not state.expired(110.0)
    assert state.expired(110.5)
    assert not fold(BEGIN, Commit(fence_id="f1", version=2, at=1.0)).expired(1e9)


def test_only_live_replicas_that_have_not_acknowledged_are_waited_for() -> None:
    state = fold(
        Lease(replica="a", at=100.0, lease_s=2.0),
        Lease(replica="b", at=100.0, lease_s=2.0),
        Lease(replica="dead", at=90.0, lease_s=2.0),
        Ack(replica="a", fence_id="f1", at=100.5),
        Ack(replica="b", fence_id="f0", at=99.0),
    )
    assert state.live(101.0) == {"a", "b"}
    assert state.unacknowledged("f1", 101.0) == {"b"}
    assert state.unacknowledged("f1", 103.0) == set()  # both leases ran out


def test_a_tombstone_removes_a_stopped_replicas_lease() -> None:
    state = fold(Lease(replica="a", at=100.0, lease_s=2.0))
    assert state.apply(b"lease/a", None) is None
    assert state.live(100.5) == set()


def test_versions_order_integers_by_value_before_strings() -> None:
    assert newer(10, 9)
    assert newer("10", 9)
    assert not newer(9, 10)
    assert not newer(3, 3)
    assert newer(0, None)
    assert newer("v2", 100)


@given(st.binary(max_size=200), st.sampled_from([FENCE_KEY, b"lease/x", b"ack/x", None]))
def test_bad_bytes_raise_a_value_error_and_change_nothing(value: bytes, key: bytes | None) -> None:
    state = fold(BEGIN, Lease(replica="a", at=100.0, lease_s=2.0))
    before = (state.fence, dict(state.leases), dict(state.acks))
    try:
        state.apply(key, value)
    except ValueError:
        assert (state.fence, state.leases, state.acks) == before
    else:
        msgspec.json.decode(value)  # it was a record after all


def test_a_record_round_trips_under_its_key() -> None:
    for record in (
        BEGIN,
        Lease(replica="r:1", at=1.0, lease_s=1.0),
        Ack(replica="r", fence_id="f", at=1.0),
    ):
        state = ControlState()
        assert state.apply(key_of(record), encode(record)) == record
