"""Scores beyond the step event: a score as an episode record carries it, and a
row of the scores topic (a score that arrived after its episode was published),
with its key. How scores combine into an episode's reward is the assembler's
(:mod:`stream_export.assemble.scoring`). Pure."""

from __future__ import annotations

import msgspec

from stream_export.contract.events import Evaluator, Score, Seq


class RecordEvaluator(Evaluator, omit_defaults=False, gc=False):
    """An evaluator as a record carries it: ``version`` null when unset. (The score
    event keeps omitting it: its digest, stored in closed markers, stays the same.)"""


class ScoreRecord(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A score as an episode record carries it (the event without its envelope):
    every field, ``label``, ``request_id`` and ``seq`` null when unset."""

    score_id: str
    name: str
    value: float
    evaluator: RecordEvaluator
    time: float
    label: str | None = None
    request_id: str | None = None
    seq: Seq | None = None


class ScoreRow(ScoreRecord, kw_only=True):
    """One row of the scores output: a score that arrived after its episode was
    published. ``record_id`` is the episode's record id (its ``episode_id``)."""

    record_id: str
    episode_id: str


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


def score_record(row: ScoreRow) -> ScoreRecord:
    """A row of the scores output as the score an episode record carries."""
    fields = msgspec.structs.asdict(row)
    del fields["record_id"], fields["episode_id"]
    return ScoreRecord(**fields)
