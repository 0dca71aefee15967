"""Closed groups as published records: a group's statistics and advantages, the
record on the groups topic (:class:`GroupRecord`), and which records a setting
leaves out. Pure: the groups stage and the verl export build records with it.

Staleness (``groups.max_weight_lag``): a rollout's weight version is the oldest
that served any of its model calls (its ``tokens.weight_version_min``); the
group's newest is the highest of those among its scored rollouts. A rollout whose
version lags it by more than the setting is stale: flagged in the record, or
(``stale_policy = "drop"``) also left out of the statistics, like a truncated
one. Only integer versions (and strings that spell one) have a lag: a rollout
with another string version, or without calls, is never stale."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

import msgspec

from stream_export.contract.calls import version_key
from stream_export.contract.decoding import decode_as, decode_episode
from stream_export.contract.episode import Episode
from stream_export.contract.reasons import DeadLetterReason
from stream_export.errors import DecodeError
from stream_export.groups.advantages import Estimator, GroupScore, score
from stream_export.groups.state import OpenGroup, RecordReason, scored
from stream_export.settings.groups import GroupSettings


def score_group(
    group: OpenGroup,
    *,
    estimator: Estimator,
    eps: float,
    ddof: int,
    dropped: Sequence[bool] = (),
) -> tuple[GroupScore, list[float | None]]:
    """The group's statistics over its scored members (not truncated, not
    ``dropped``: index-aligned, empty for none), and each member's advantage
    (index-aligned with ``group.members``; None for a member left out)."""
    out = [m.truncated or (i < len(dropped) and dropped[i]) for i, m in enumerate(group.members)]
    kept = [m for m, gone in zip(group.members, out, strict=True) if not gone]
    result = score([m.reward for m in kept], estimator=estimator, eps=eps, ddof=ddof)
    advantages = iter(result.advantages)
    return result, [None if gone else next(advantages) for gone in out]


def _version(episode: Episode) -> int | None:
    """A rollout's weight version for staleness: its oldest, if it is an integer."""
    low = episode.tokens.weight_version_min if episode.tokens is not None else None
    if low is None:
        return None
    kind, value, _ = version_key(low)
    return value if kind == 0 else None


def stale_flags(rollouts: Sequence[Episode], max_lag: int | None) -> list[bool]:
    """Per rollout, whether it is stale (see the module doc); [] when unchecked."""
    if max_lag is None:
        return []
    versions = [_version(e) for e in rollouts]
    known = [
        v for v, e in zip(versions, rollouts, strict=True) if v is not None and not e.truncated
    ]
    if not known:
        return [False] * len(rollouts)
    newest = max(known)
    return [v is not None and newest - v > max_lag for v in versions]


class GroupRecord(msgspec.Struct, kw_only=True):
    """A closed group as published on the groups topic: its rollouts (index-aligned
    with ``advantages``, None for a truncated rollout) and their statistics.

    ``group_id`` is its identity: a re-emission after a crash is the same group,
    so sinks drop the repeat. A late rollout is a record of its own (reason
    ``late``, ``complete`` false), keyed ``<group_id>/late/<episode_id>``.
    """

    record_id: str
    group_id: str
    close_reason: RecordReason
    complete: bool
    expected_size: int | None
    size: int
    missing: int | None
    duplicates: int
    truncated: int
    mean: float
    std: float
    zero_variance: bool
    estimator: Estimator
    eps: float
    advantages: list[float | None]
    rollouts: list[Episode]
    closed_at: float
    #: Index-aligned with ``rollouts``: stale by ``groups.max_weight_lag`` (empty
    #: when it is unset, and in records written before it existed).
    stale: list[bool] = []
    #: What was done with them: "flag" (scored as any other) or "drop" (left
    #: out of the statistics, advantage None).
    stale_policy: Literal["flag", "drop"] = "flag"


_record_decoder: Final = msgspec.json.Decoder(GroupRecord)


def decode_record(data: bytes | None) -> GroupRecord:
    """One groups-topic message, or DecodeError."""
    if not data:
        raise DecodeError(
            "message is empty; expected a JSON group record", reason=DeadLetterReason.NOT_JSON
        )
    return decode_as(_record_decoder, data, "valid group record")


def group_record(
    group: OpenGroup,
    rollouts: list[Episode],
    reason: RecordReason,
    *,
    complete: bool,
    missing: int | None,
    closed_at: float,
    estimator: Estimator,
    eps: float,
    ddof: int,
    stale: list[bool] | None = None,
    stale_policy: Literal["flag", "drop"] = "flag",
) -> GroupRecord:
    """The record of a closed group (``rollouts``: its members' episodes, in order;
    ``stale``: which of them are, see :func:`stale_flags`)."""
    stale = stale or []
    dropped = stale if stale_policy == "drop" else []
    stats, advantages = score_group(group, estimator=estimator, eps=eps, ddof=ddof, dropped=dropped)
    record_id = group.group_id
    if reason == "late":
        record_id = f"{group.group_id}/late/{group.members[0].episode_id}"
    return GroupRecord(
        record_id=record_id,
        group_id=group.group_id,
        close_reason=reason,
        complete=complete,
        expected_size=group.expected,
        size=len(group.members),
        missing=missing,
        duplicates=group.duplicates,
        truncated=len(group.members) - len(scored(group.members)),
        mean=stats.mean,
        std=stats.std,
        zero_variance=stats.zero_variance,
        estimator=estimator,
        eps=eps,
        advantages=advantages,
        rollouts=rollouts,
        closed_at=closed_at,
        stale=stale,
        stale_policy=stale_policy,
    )


def closed_record(
    group: OpenGroup,
    reason: RecordReason,
    complete: bool,
    missing: int | None,
    closed_at: float,
    settings: GroupSettings,
    rollouts: list[Episode] | None = None,
) -> GroupRecord:
    """The record of a closed group whose members hold their episodes' bytes (or
    whose ``rollouts`` are given), scored as ``settings`` say (for the groups stage
    and the verl export alike)."""
    if rollouts is None:
        rollouts = [decode_episode(member.record) for member in group.members]
    return group_record(
        group,
        rollouts,
        reason,
        complete=complete,
        missing=missing,
        closed_at=closed_at,
        estimator=settings.estimator,
        eps=settings.eps,
        ddof=settings.std_ddof,
        stale=stale_flags(rollouts, settings.max_weight_lag),
        stale_policy=settings.stale_policy,
    )


def dropped_for_variance(record: GroupRecord, on: Literal["none", "reward", "outcome"]) -> bool:
    """Whether ``groups.drop_zero_variance`` (``on``) leaves a closed group out: on
    ``reward`` when it is ``zero_variance``, on ``outcome`` when its scored rollouts
    all have one outcome. A late rollout, exported on its own, never is."""
    if on == "none" or record.close_reason == "late":
        return False
    if on == "reward":
        return record.zero_variance
    kept = zip(record.rollouts, record.advantages, strict=True)
    return len({episode.outcome for episode, a in kept if a is not None}) <= 1
