"""The typed outputs' cases, episodes and records, and rows as a typed reader gives them."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from stream_export.assemble.scoring import combine
from stream_export.contract.episode import Episode
from stream_export.contract.scores import RecordEvaluator, ScoreRecord
from stream_export.output import parquet
from stream_export.settings.scores import ScoreSettings
from tests.support.call_episodes import tool_episode
from tests.support.golden import GOLDEN_CASES
from tests.support.group_records import record, rollout

CASES: dict[str, dict[str, Any]] = {
    **{k: v for k, v in GOLDEN_CASES.items() if not k.startswith("episode-")},
    "tokens": {"format": "tokens"},
    "tokens-nested": {"format": "tokens", "metadata_mode": "nested"},
    "conversational-none": {"format": "conversational", "metadata_mode": "none"},
    "text-chosen-fields": {"metadata_fields": ["start_time", "end_time", "domain"]},
    "tokens-scores": {
        "format": "tokens",
        "metadata_fields": ["rewards", "scores", "scores_missing"],
    },
    "conversational-scores-nested": {
        "format": "conversational",
        "metadata_mode": "nested",
        "metadata_fields": ["episode_id", "reward", "rewards", "scores", "scores_missing"],
    },
}


def scored(episode: Episode) -> Episode:
    """``episode`` with a judge's score (every field set), a verifier's (no label,
    request id or seq) and a required name it lacks."""
    judge, ci = RecordEvaluator(id="judge", version="v1"), RecordEvaluator(id="ci")
    records = [
        ScoreRecord(
            score_id="j",
            name="judge",
            value=0.5,
            evaluator=judge,
            time=1.0,
            label="ok",
            request_id="req-2",
            seq=0,
        ),
        ScoreRecord(score_id="v", name="tests", value=1.0, evaluator=ci, time=2.0),
    ]
    required = ScoreSettings(required=["judge", "human"])
    return combine(episode, records, episode.reward, required)


def call_episodes() -> list[Episode]:
    """A scored episode of model calls, and an unscored one."""
    return [scored(tool_episode("a", group_id="g")), tool_episode("b", versions=(7, 7), offset=5)]


def conform(value: Any, kind: pa.DataType) -> Any:
    """``value`` as a typed reader gives it back: absent struct fields null, weight
    versions as text, float32 rounding; a key the schema lacks fails."""
    if value is None:
        return None
    if pa.types.is_struct(kind):
        assert set(value) <= {f.name for f in kind}, set(value) - {f.name for f in kind}
        return {f.name: conform(value.get(f.name), f.type) for f in kind}
    if pa.types.is_list(kind):
        return [conform(v, kind.value_type) for v in value]
    if pa.types.is_string(kind):
        return str(value)
    if pa.types.is_floating(kind):
        return pa.scalar(value, kind).as_py()  # float32 columns round
    return value


def conform_row(row: dict[str, Any], columns: pa.Schema) -> dict[str, Any]:
    return conform(row, pa.struct(list(columns)))  # type: ignore[no-any-return]


def lines(rows: list[bytes]) -> bytes:
    return b"".join(line + b"\n" for line in rows)


def group_records() -> list[Any]:
    text = record([rollout("x", 1.0), rollout("y", 0.0)], 2)
    tokens = record([tool_episode("a", group_id="g"), tool_episode("b", reward=0.0)], 2)
    return [text, tokens]


def transcoded(src: Path, columns: Any) -> list[dict[str, Any]]:
    out = io.BytesIO()
    parquet.transcode(src, out, columns, "zstd")
    table = pq.read_table(io.BytesIO(out.getvalue()))
    assert table.schema.equals(columns)
    return table.to_pylist()  # type: ignore[no-any-return]
