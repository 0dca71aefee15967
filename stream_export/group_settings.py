"""The ``groups.*`` section of the one settings object (``stream_export.config``
embeds it as ``Settings.groups``): GRPO groups. Kept apart only to keep config.py
readable."""

from __future__ import annotations

from typing import Annotated, Final, Literal

import msgspec
from msgspec import Meta

from stream_export.errors import ConfigError
from stream_export.events import MAX_GROUP_SIZE

_DAY: Final = 86_400.0
_YEAR: Final = 365 * _DAY


class GroupSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """GRPO groups: rollouts of one task (one group_id) scored against each other."""

    #: Run the groups stage (stream_export.groups.stage) in the worker.
    enabled: bool = False
    #: Expected rollouts of a group whose start events give no group_size: 1 to
    #: 100,000, or empty: such a group closes only at its timeout.
    default_size: Annotated[int, Meta(ge=1, le=MAX_GROUP_SIZE)] | None = None
    #: The group of an episode without group_id: "none" (it joins no group) or
    #: "prompt_hash" (episodes with the same prompt, after trimming and collapsing
    #: white space, form one group: ``prompt:<sha256 prefix>``).
    fallback_id: Literal["none", "prompt_hash"] = "none"
    #: A group closes this long (event time) after its first rollout ended, with
    #: whatever arrived: > 0, at most 30 days. Never shorter than
    #: assemble.idle_timeout_s + assemble.grace_s, which is used when larger (by
    #: then the assembler has closed any rollout still running), nor than
    #: scores.hold_s with scores.required (a rollout waits that long for its scores).
    timeout_s: Annotated[float, Meta(gt=0, le=30 * _DAY)] = 900.0
    #: A timed-out group with fewer scored rollouts (not truncated) is dropped and
    #: counted; one with at least this many is emitted complete=false: 1 to 100,000.
    min_members: Annotated[int, Meta(ge=1, le=100_000)] = 2
    #: A rollout of an already closed group is counted and exported on its own;
    #: "dead_letter" also writes it to the dead-letter topic (reason late_rollout).
    late_policy: Literal["dead_letter", "count"] = "dead_letter"
    #: A rollout whose prompt (after trimming and collapsing white space) differs
    #: from its group's first rollout's: "dead_letter" leaves it out of the group
    #: (reason group_prompt_mismatch; it is still in the episode output), "allow"
    #: groups it anyway (tasks whose prompts differ per rollout by design).
    mixed_prompts: Literal["dead_letter", "allow"] = "dead_letter"
    #: How long closed-group ids are remembered to recognise late and replayed
    #: rollouts: > 0, at most 10 years, and at least timeout_s.
    closed_retention_s: Annotated[float, Meta(gt=0, le=10 * _YEAR)] = 7 * _DAY
    #: grpo ((r - mean) / (std + eps)), dr_grpo (r - mean) or rloo (leave-one-out
    #: baseline); see stream_export.groups.advantages.
    estimator: Literal["grpo", "dr_grpo", "rloo"] = "grpo"
    #: Added to the standard deviation before dividing (grpo): 0 to 1.
    eps: Annotated[float, Meta(ge=0, le=1)] = 1e-6
    #: Delta degrees of freedom of the standard deviation: 1 (sample, torch.std's
    #: default) or 0 (population).
    std_ddof: Annotated[int, Meta(ge=0, le=1)] = 1
    #: A group gives a DPO preference pair (best against worst rollout) only when
    #: their rewards differ by more than this: 0 to 1e9.
    preference_margin: Annotated[float, Meta(ge=0, le=1e9)] = 0.0
    #: The prompts output keeps a task only when its pass rate is strictly above
    #: this: 0 to 1, or empty (no lower bound; the default keeps every task).
    prompts_min_pass_rate: Annotated[float, Meta(ge=0, le=1)] | None = None
    #: ... and strictly below this: 0 to 1, or empty (no upper bound). With both
    #: set, min must be < max (an empty band would keep nothing).
    prompts_max_pass_rate: Annotated[float, Meta(ge=0, le=1)] | None = None
    #: Leave zero-variance groups out of every group output (and the verl export),
    #: counted as dropped (reason zero_variance): "none" keeps them, "reward" drops
    #: a group whose scored rollouts' rewards are all equal, "outcome" one whose
    #: scored rollouts all have the same outcome.
    drop_zero_variance: Literal["none", "reward", "outcome"] = "none"
    #: A rollout whose weight version (the oldest that served its model calls)
    #: lags the newest of its group's by more than this is stale: 0 to 10^9, or
    #: empty (never checked). Integer versions only (strings that spell one too;
    #: other strings are never stale).
    max_weight_lag: Annotated[int, Meta(ge=0, le=1_000_000_000)] | None = None
    #: What a stale rollout gets: "flag" (marked ``stale`` in the group record and
    #: its rollouts rows, scored as any other) or "drop" (also left out of the
    #: group's statistics and of every group output, like a truncated one).
    stale_policy: Literal["flag", "drop"] = "flag"

    def __post_init__(self) -> None:
        low, high = self.prompts_min_pass_rate, self.prompts_max_pass_rate
        if low is not None and high is not None and low >= high:
            raise ConfigError(
                f"invalid setting groups.prompts_min_pass_rate={low:g}: "
                f"must be < groups.prompts_max_pass_rate ({high:g})"
            )
        if self.closed_retention_s < self.timeout_s:
            raise ConfigError(
                f"invalid setting groups.closed_retention_s={self.closed_retention_s:g}: "
                f"must be >= groups.timeout_s ({self.timeout_s:g})"
            )
