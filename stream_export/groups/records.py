"""A closed group made into its published record: its statistics, its rollouts'
advantages and staleness, as a :class:`~stream_export.contract.groups.GroupRecord`.
Pure: the groups stage and the verl export build records with it.

Staleness (``groups.max_weight_lag``): a rollout's weight version is the oldest
that served any of its model calls (its ``tokens.weight_version_min``); the
group's newest is the highest of those among its scored rollouts. A rollout whose
version lags it by more than the setting is stale: flagged in the record, or
(``stale_policy = "drop"``) also left out of the statistics, like a truncated
one. Only integer versions (and strings that spell one) have a lag: a rollout
with another string version, or without calls, is never stale."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from stream_export.contract.calls import version_key
from stream_export.contract.decoding import decode_episode
from stream_export.contract.episode import Episode
from stream_export.contract.groups import Estimator, GroupRecord, RecordReason
from stream_export.groups.advantages import GroupScore, score
from stream_export.groups.state import OpenGroup, scored
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


def rollout_version(episode: Episode) -> int | None:
    """A rollout's weight version for staleness and the learning curve: its oldest,
    if it is an integer."""
    low = episode.tokens.weight_version_min if episode.tokens is not None else None
    if low is None:
        return None
    kind, value, _ = version_key(low)
    return value if kind == 0 else None


def stale_flags(rollouts: Sequence[Episode], max_lag: int | None) -> list[bool]:
    """Per rollout, whether it is stale (see the module doc); [] when unchecked."""
    if max_lag is None:
        return []
    versions = [rollout_version(e) for e in rollouts]
    known = [
        v for v, e in zip(versions, rollouts, strict=True) if v is not None and not e.truncated
    ]
    if not known:
        return [False] * len(rollouts)
    newest = max(known)
    return [v is not None and newest - v > max_lag for v in versions]


def rewards_by_version(rollouts: Sequence[Episode]) -> dict[int, list[float]]:
    """The rewards of the scored rollouts (rewarded, not truncated) by the version
    that served them (:func:`rollout_version`; rollouts without one are left out):
    the learning curve's points, one group at a time."""
    out: dict[int, list[float]] = {}
    for e in rollouts:
        version = rollout_version(e)
        if version is not None and e.reward is not None and not e.truncated:
            out.setdefault(version, []).append(e.reward)
    return out


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
