"""The pure decision whether a topic is still the one whose offsets were kept."""

from __future__ import annotations

from stream_export.kafka import reset, topic_ids


def test_the_same_topic_further_on_is_no_reset() -> None:
    done = {0: 68, 1: 83}
    assert reset.detect("t", done=done, ends={0: 69, 1: 120}) is None
    assert reset.detect("t", done=done, ends={0: 69, 1: 84}, known_id="a", current_id="a") is None
    assert reset.detect("t", done={}, ends={}) is None


def test_an_offset_at_or_past_the_end_is_a_reset() -> None:
    # The case measured on main: checkpoint at 69/84/71/76, a new topic of 50 each.
    done = {0: 69, 1: 84, 2: 71, 3: 76}
    found = reset.detect("episodes", done=done, ends=dict.fromkeys(range(4), 50))
    assert found is not None and found.cause == "offsets"
    assert "partition 0 has no offset 69 (it ends at 50)" in found.detail
    assert found.detail.endswith("; 1 more")
    # The record at the checkpointed offset itself must exist.
    assert reset.detect("t", done={0: 10}, ends={0: 10}) is not None
    assert reset.behind({0: 9, 1: 10}, {0: 10, 1: 10}) == {1: 10}


def test_a_partition_that_is_gone_is_a_reset() -> None:
    found = reset.detect("t", done={0: 1, 5: 1}, ends={0: 100})
    assert found is not None and "partition 5 has no offset 1 (it is gone)" in found.detail


def test_a_changed_topic_id_is_a_reset_even_when_the_offsets_fit() -> None:
    found = reset.detect("t", done={0: 3}, ends={0: 500}, known_id="old", current_id="new")
    assert found is not None and found.cause == "topic_id"
    assert found.detail == "its topic id changed from old to new"
    line = found.explain("the checkpoint in /out", "do this")
    assert line.startswith("the checkpoint in /out is for an earlier incarnation of topic 't'")
    assert line.endswith("; do this") and "\n" not in line


def test_an_unknown_id_on_either_side_is_no_evidence() -> None:
    for known, current in [(None, "new"), ("old", None), (None, None)]:
        assert (
            reset.detect("t", done={0: 3}, ends={0: 9}, known_id=known, current_id=current) is None
        )


def test_topic_ids_print_as_kafka_prints_them() -> None:
    raw = bytes.fromhex("6e1f6a4a5e2a4c0c8a8b0d1e2f3a4b5c")
    assert topic_ids.text(raw) == "bh9qSl4qTAyKiw0eLzpLXA"
    assert len(topic_ids.text(bytes(16))) == 22
