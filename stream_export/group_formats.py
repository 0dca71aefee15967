"""Closed groups -> ``group`` training rows: pure functions, no I/O.

One row per group, the prompt once and index-aligned lists of its scored
(not truncated) rollouts, the shape ART's ``TrajectoryGroup`` and rLLM / SkyRL
group their trajectories in::

    {"group_id", "prompt", "completions", "episode_ids", "rewards", "advantages",
     "outcomes", "size", "expected_size", "complete", "close_reason", "missing",
     "truncated", "duplicates", "mean", "std", "zero_variance", "estimator", "eps"}

``prompt`` and ``completions`` are text, as the ``text`` format writes them.
Every column has one type in every row (no nulls), so files load with
``datasets.load_dataset("json", ...)`` without ``features=``: ``expected_size``
and ``missing`` are 0 when the group's size was never announced. A late rollout
(``close_reason`` ``late``) has no group row.

The worker writes them through the sink machinery (checkpoint, manifest, exactly
once) with the prefix ``<sink.prefix>.groups`` (``training-data.groups.jsonl``:
the episodes' glob ``training-data-*.jsonl`` does not take them in).
"""

from __future__ import annotations

from typing import Any

from stream_export import formats
from stream_export.errors import FormatError
from stream_export.groups import GroupRecord, decode_record, member_of

Row = dict[str, Any]


def group_row(record: GroupRecord) -> Row | None:
    """The ``group`` row of a closed group (None for a late rollout)."""
    if record.close_reason == "late":
        return None
    kept = [
        (episode, advantage)
        for episode, advantage in zip(record.rollouts, record.advantages, strict=True)
        if advantage is not None
    ]
    completions = []
    for episode, _ in kept:
        texts = formats.text_records(episode, False)
        completions.append(texts[0]["completion"] if texts else "")
    return {
        "group_id": record.group_id,
        "prompt": formats.prompt_text(record.rollouts[0].prompt),
        "completions": completions,
        "episode_ids": [e.episode_id for e, _ in kept],
        "rewards": [member_of(e).reward for e, _ in kept],
        "advantages": [a for _, a in kept],
        "outcomes": [e.outcome for e, _ in kept],
        "size": record.size,
        "expected_size": record.expected_size or 0,
        "complete": record.complete,
        "close_reason": record.close_reason,
        "missing": record.missing or 0,
        "truncated": record.truncated,
        "duplicates": record.duplicates,
        "mean": record.mean,
        "std": record.std,
        "zero_variance": record.zero_variance,
        "estimator": record.estimator,
        "eps": record.eps,
    }


def group_reader(value: bytes | None) -> tuple[str, list[bytes], float, object]:
    """The groups topic's sink reader (:data:`stream_export.sink.Reader`): the
    record id dedupes a re-emitted group."""
    record = decode_record(value)
    try:
        row = group_row(record)
        lines = [] if row is None else [formats.encode(row)]
    except Exception as exc:  # a bug must cost one record, never the worker
        raise FormatError(f"group row of {record.record_id!r} failed: {exc!r}") from exc
    return record.record_id, lines, record.closed_at, None
