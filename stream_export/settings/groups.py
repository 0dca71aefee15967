"""The ``groups.*`` settings section (``Settings.groups``): GRPO groups, their
outputs and the group judge."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from stream_export.contract.events import END_REWARD, MAX_GROUP_SIZE, Id
from stream_export.errors import ConfigError
from stream_export.settings.gateway import UpstreamUrl
from stream_export.settings.values import DAY, YEAR, Secret


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
    timeout_s: Annotated[float, Meta(gt=0, le=30 * DAY)] = 900.0
    #: A timed-out group with fewer scored rollouts (not truncated) is dropped and
    #: counted; one with at least this many is emitted complete=false: 1 to 100,000.
    min_members: Annotated[int, Meta(ge=1, le=100_000)] = 2
    #: A rollout of an already closed group is counted and exported on its own;
    #: "dead_letter" also writes it to the dead-letter topic (reason late_rollout).
    late_policy: Literal["dead_letter", "count"] = "dead_letter"
    #: A rollout whose prompt (after trimming and collapsing white space) differs
    #: from its group's first rollout's. "dead_letter" leaves it out of the group
    #: (reason group_prompt_mismatch; it is still in the episode output). "allow"
    #: groups it anyway (tasks whose prompts differ per rollout by design).
    mixed_prompts: Literal["dead_letter", "allow"] = "dead_letter"
    #: How long closed-group ids are remembered to recognise late and replayed
    #: rollouts, after the group closed and its latest rollout ended. A rollout
    #: that ended longer ago opens no group: it is late. > 0, at most 10 years,
    #: and at least timeout_s.
    closed_retention_s: Annotated[float, Meta(gt=0, le=10 * YEAR)] = 7 * DAY
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
    #: counted as dropped (reason zero_variance). "none" keeps them. "reward" drops
    #: a group whose scored rollouts' rewards are all equal. "outcome" drops one
    #: whose scored rollouts all have the same outcome.
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
    #: The group judge (stream_export.groups.judge): an OpenAI-compatible base URL
    #: (``http://host:port/v1``) that scores every closed group's rollouts against
    #: each other, 0 to 10 each (score value / 10), before the group is published;
    #: empty: no judge. Needs judge_model and scores.enabled=true.
    judge_url: UpstreamUrl | None = None
    #: The model the judge is asked for (also the score's evaluator id).
    judge_model: Annotated[str, Meta(max_length=200)] = ""
    #: The API key sent to the judge (Bearer); never shown anywhere.
    judge_api_key: Secret | None = None
    #: The name of the judge's score (in rewards, scores and the scores output): 1-64
    #: letters, digits or "_", not starting with a digit, not end_reward.
    judge_name: Annotated[str, Meta(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")] = "judge"
    #: The evaluator version the judge's scores carry (e.g. the prompt's version).
    judge_version: Id | None = None
    #: Longest wait for one judge answer: > 0, at most 3600 s.
    judge_timeout_s: Annotated[float, Meta(gt=0, le=3600)] = 60.0
    #: Attempts per group (an HTTP error, a timeout or an answer that is not one
    #: score per rollout fails one): 1 to 100. After the last, the group is
    #: published without the judge's score (named in its rollouts' scores_missing).
    judge_attempts: Annotated[int, Meta(ge=1, le=100)] = 4
    #: Wait before the second attempt, doubling up to judge_backoff_max_s: > 0 to 3600 s.
    judge_backoff_s: Annotated[float, Meta(gt=0, le=3600)] = 1.0
    judge_backoff_max_s: Annotated[float, Meta(gt=0, le=3600)] = 30.0
    #: Each completion is shown to the judge cut to this many characters (its
    #: start and end, "[...]" between), so a group's request stays bounded: 100 to 10^6.
    judge_max_chars: Annotated[int, Meta(ge=100, le=1_000_000)] = 4000
    #: Groups judged at once per worker: 1 to 1000.
    judge_concurrency: Annotated[int, Meta(ge=1, le=1000)] = 8

    def __post_init__(self) -> None:
        low, high = self.prompts_min_pass_rate, self.prompts_max_pass_rate
        if low is not None and high is not None and low >= high:
            raise ConfigError(
                f"invalid setting groups.prompts_min_pass_rate={low:g}: "
                f"must be < groups.prompts_max_pass_rate ({high:g})"
            )
        if self.judge_name == END_REWARD:
            raise ConfigError(
                f"invalid setting groups.judge_name={END_REWARD!r}: the end event's reward "
                "has that name"
            )
        if self.judge_url is not None and not self.judge_model:
            raise ConfigError(
                f"invalid setting groups.judge_url={self.judge_url!r}: needs groups.judge_model"
            )
        if self.closed_retention_s < self.timeout_s:
            raise ConfigError(
                f"invalid setting groups.closed_retention_s={self.closed_retention_s:g}: "
                f"must be >= groups.timeout_s ({self.timeout_s:g})"
            )
