"""The groups topic's record: a closed GRPO group as the worker publishes it (its
rollouts, their advantages and statistics), and the reward a rollout counts with.

The trainer feed and the group sinks read these records; a reader in another
language decodes the same JSON.
"""

from __future__ import annotations

from typing import Final, Literal

import msgspec

from stream_export.contract.episode import Episode

#: Why a group record was written: closed at its size or timeout, or a late rollout
#: exported on its own.
RecordReason = Literal["size", "timeout", "late"]
#: How the advantages were computed (``groups.estimator``).
Estimator = Literal["grpo", "dr_grpo", "rloo"]
#: Reward of a rollout that reports none: its outcome as 1.0 (success) or 0.0.
OUTCOME_REWARD: Final = {"success": 1.0, "failure": 0.0, "other": 0.0}


def rollout_reward(episode: Episode) -> float:
    """The reward a rollout counts with in its group: its own, else its outcome's."""
    return episode.reward if episode.reward is not None else OUTCOME_REWARD[episode.outcome]


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
