"""The contract of scores beyond the step event: a score as an episode record
carries it, and a row of the scores topic (a score that arrived after its
episode was published), with its key. Pure."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

from stream_export.contract.events import Episode, RecordEvaluator, Score, ScoreRecord
from stream_export.settings.reward import END_REWARD
from stream_export.settings.scores import ScoreSettings


class ScoreRow(ScoreRecord, kw_only=True):
    """One row of the scores output: a score that arrived after its episode was
    published. ``record_id`` is the episode's record id (its ``episode_id``)."""

    record_id: str
    episode_id: str


def rewards_column(episode: Episode) -> list[dict[str, Any]]:
    """The episode's ``rewards`` as the outputs write them: ``{"name", "value"}`` in
    its order (a column of one type; a map of any names has none in ``datasets``)."""
    return [{"name": name, "value": value} for name, value in episode.rewards.items()]


def scores_column(episode: Episode) -> list[dict[str, Any]]:
    """The episode's ``scores`` as the outputs write them, every field in each."""
    columns: list[dict[str, Any]] = msgspec.to_builtins(episode.scores)
    return columns


def digest(score: Score) -> int:
    """The score's content without its time (a resend may restamp it)."""
    data = msgspec.json.encode(msgspec.structs.replace(score, time=0.0))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def record_of(score: Score) -> ScoreRecord:
    return ScoreRecord(
        score_id=score.score_id,
        name=score.name,
        value=score.value,
        evaluator=RecordEvaluator(id=score.evaluator.id, version=score.evaluator.version),
        time=score.time,
        label=score.label,
        request_id=score.request_id,
        seq=score.seq,
    )


def row_key(episode_id: str, score_id: str) -> bytes:
    """A late score's key on the scores topic, and its id in the sink: unambiguous
    whatever the ids hold."""
    return msgspec.json.encode([episode_id, score_id])


def late_row(score: Score) -> bytes:
    fields = msgspec.structs.asdict(record_of(score))
    return msgspec.json.encode(
        ScoreRow(**fields, record_id=score.episode_id, episode_id=score.episode_id)
    )


def combine(
    episode: Episode, records: list[ScoreRecord], end_reward: float | None, settings: ScoreSettings
) -> Episode:
    """``episode`` with ``records`` (in arrival order) as its scores: ``rewards`` by
    name (the last of a name, and ``end_reward``, the end event's reward), the
    required names it lacks, and its reward from ``scores.reward``."""
    rewards = {r.name: r.value for r in records}
    if end_reward is not None:
        rewards[END_REWARD] = end_reward
    expression = settings.expression()
    return msgspec.structs.replace(
        episode,
        rewards=rewards,
        scores=records,
        scores_missing=[name for name in settings.required if name not in rewards],
        reward=end_reward if expression is None else expression.evaluate(rewards),
    )


def with_late(episode: Episode, late: list[ScoreRecord], settings: ScoreSettings) -> Episode:
    """A published ``episode`` joined offline with the scores that came after it
    (the scores output's rows, each once): ``export --with-scores``."""
    had, added = {s.score_id for s in episode.scores}, []
    for record in late:  # each score once (a row may be there twice)
        if record.score_id not in had:
            had.add(record.score_id)
            added.append(record)
    if not added:
        return episode
    fallback = None if settings.expression() is not None else episode.reward
    end_reward = episode.rewards.get(END_REWARD, fallback)
    return combine(episode, [*episode.scores, *added], end_reward, settings)


def score_record(row: ScoreRow) -> ScoreRecord:
    """A row of the scores output as the score an episode record carries."""
    fields = msgspec.structs.asdict(row)
    del fields["record_id"], fields["episode_id"]
    return ScoreRecord(**fields)
