"""A finished episode as the worker publishes it on the episodes topic: its steps,
its outcome and reward, its scores, its token segments and where it came from."""

from __future__ import annotations

import msgspec

from stream_export.contract.calls import Tokens
from stream_export.contract.events import (
    SCHEMA_VERSION,
    GroupSize,
    Metadata,
    Outcome,
    Prompt,
    Step,
)
from stream_export.contract.scores import ScoreRecord


class SourceOffset(msgspec.Struct, array_like=True):
    """Where an event came from: steps-topic partition and offset."""

    partition: int
    offset: int


class Episode(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A finished episode as published on the episodes topic.

    ``episode_id`` is its stable identity: a re-emission after a crash carries the
    same id, so sinks drop the repeat.
    """

    episode_id: str
    agent_id: str
    prompt: Prompt
    steps: list[Step]
    start_time: float
    end_time: float
    outcome: Outcome
    group_id: str | None = None
    #: The start event's group_size (rollouts the group expects).
    group_size: GroupSize | None = None
    reward: float | None = None
    #: Start metadata updated with end metadata (end wins on the same key).
    metadata: Metadata = {}
    truncated: bool = False
    truncated_reason: str | None = None
    #: Steps-topic offsets the episode was built from (for lineage / audits).
    sources: list[SourceOffset] = []
    #: The llm_call steps as token segments (None without llm_call steps); in
    #: ``steps`` those calls keep everything but their token arrays, which are
    #: emptied (their tokens are here).
    tokens: Tokens | None = None
    #: The scores the episode had when it was published: by name (the last
    #: arrived of a name), each with its evaluator, and the names of
    #: ``scores.required`` it was published without (their hold timed out).
    rewards: dict[str, float] = {}
    scores: list[ScoreRecord] = []
    scores_missing: list[str] = []
    v: int = SCHEMA_VERSION

    @property
    def duration(self) -> float:
        return max(0.0, self.end_time - self.start_time)
