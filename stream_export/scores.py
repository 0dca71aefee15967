"""The contract of scores beyond the step event: a score as an episode record
carries it, and a row of the scores topic (a score that arrived after its
episode was published), with its key. Pure."""

from __future__ import annotations

import hashlib

import msgspec

from stream_export.events import Score, ScoreRecord


class ScoreRow(ScoreRecord, kw_only=True, omit_defaults=True):
    """One row of the scores output: a score that arrived after its episode was
    published. ``record_id`` is the episode's record id (its ``episode_id``)."""

    record_id: str
    episode_id: str


def digest(score: Score) -> int:
    """The score's content without its time (a resend may restamp it)."""
    data = msgspec.json.encode(msgspec.structs.replace(score, time=0.0))
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def record_of(score: Score) -> ScoreRecord:
    return ScoreRecord(
        score_id=score.score_id,
        name=score.name,
        value=score.value,
        evaluator=score.evaluator,
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
