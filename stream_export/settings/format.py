"""The ``format.*`` settings section (``Settings.format``): which records the episode
output writes (format, granularity, metadata) and which episodes it keeps."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from stream_export.contract.widths import INT32_MAX
from stream_export.errors import ConfigError
from stream_export.settings.values import Finite, NonEmpty


class FormatSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: The record's shape. text: prompt/completion strings. conversational: TRL
    #: messages. messages: the whole conversation in one "messages" list, for SFT
    #: trainers. episode: the whole structured episode. tokens: one row per token
    #: segment of the episode's model calls (input_ids, loss_mask, logprobs,
    #: prompt_len), for token-level RL trainers. Or a formatter registered under the
    #: stream_export.formatters entry point, or a dotted path "package.module:function".
    format: NonEmpty = "text"
    #: One record per episode, or one per decision step (not for messages).
    granularity: Literal["episode", "step"] = "episode"
    #: What the text of a completion starts with, so that a trainer joining prompt +
    #: completion as they are (TRL, OpenRLHF) finds a break between them: a blank
    #: line, a newline, a space, or none (the Daydreams bytes). Group outputs too.
    text_separator: Literal["blank_line", "newline", "space", "none"] = "blank_line"
    #: Metadata as top-level columns, nested under "metadata", or left out (the
    #: default: text records are then exactly the seed's {"prompt", "completion"}).
    #: The episode format always carries every field and ignores this.
    metadata_mode: Literal["columns", "nested", "none"] = "none"
    #: Which metadata fields to include; empty means the documented default set
    #: (formats.DEFAULT_METADATA_FIELDS). Names: episode_id, agent_id, group_id,
    #: outcome, reward, steps, duration, truncated, truncated_reason, domain,
    #: difficulty, start_time, end_time, decision (step granularity), rewards,
    #: scores, scores_missing (the reward's components), or any key of the
    #: episode metadata.
    metadata_fields: list[NonEmpty] = []
    #: Write only episodes whose outcome is "success".
    only_success: bool = False
    #: Write only episodes with at least / at most this many steps (0 to 2**31 - 1;
    #: min_steps <= max_steps).
    min_steps: Annotated[int, Meta(ge=0, le=INT32_MAX)] | None = None
    max_steps: Annotated[int, Meta(ge=0, le=INT32_MAX)] | None = None
    #: Write only episodes with a reward of at least this (a finite number; no
    #: reward: dropped).
    min_reward: Finite | None = None
    #: Keep only these domains (metadata "domain"); empty keeps all.
    domains: list[NonEmpty] = []

    def __post_init__(self) -> None:
        low, high = self.min_steps, self.max_steps
        if low is not None and high is not None and low > high:
            raise ConfigError(
                f"invalid setting format.min_steps={low}: must be <= format.max_steps ({high})"
            )
