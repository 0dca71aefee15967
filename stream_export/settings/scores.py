"""The ``scores.*`` settings section (``Settings.scores``): rewards that arrive as
``score`` events, joined to their episodes by the assembler."""

from __future__ import annotations

import functools
from typing import Annotated

import msgspec
from msgspec import Meta

from stream_export.contract.events import ScoreName
from stream_export.settings.reward import RewardExpression
from stream_export.settings.values import DAY


class ScoreSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, dict=True):
    """Scores from judges, verifiers and people, joined in the stream."""

    #: Run the scores output: a score for an episode already published goes to the
    #: topic ``<worker.app_id>-scores`` and the files ``<sink.prefix>.scores``, one
    #: row per score. Off: such a score is a dead letter ``late_score``.
    enabled: bool = False
    #: Score names an ended episode waits for before it is published (up to
    #: ``hold_s``); empty: published as soon as it ends. Up to 32 names.
    required: Annotated[list[ScoreName], Meta(max_length=32)] = []
    #: How long (event time, after its last event) an ended episode waits for its
    #: required scores: 0 to 1 day. It is published with the scores it has then,
    #: and the names still missing in ``scores_missing``.
    hold_s: Annotated[float, Meta(ge=0, le=DAY)] = 300.0
    #: The episode's ``reward`` (formats, filters and group advantages use it): an
    #: expression over score names and ``end_reward`` (the end event's reward),
    #: e.g. ``0.7*correctness + 0.3*format``, with numbers, + - * /, parentheses,
    #: min() and max(); empty: the end event's reward. A name without a value makes
    #: the reward empty (null), as does a result that is not a finite number.
    reward: Annotated[str, Meta(max_length=500)] = ""

    def __post_init__(self) -> None:
        if self.reward.strip():
            self.expression()  # refuse a bad expression when the settings load

    @functools.cached_property
    def _parsed(self) -> RewardExpression | None:
        return RewardExpression(self.reward) if self.reward.strip() else None

    def expression(self) -> RewardExpression | None:
        """The parsed ``reward`` (None: the end event's reward)."""
        return self._parsed
