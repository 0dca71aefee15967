"""Every number the worker accepts fits the type its output declares, and every other
one is a dead letter ``out_of_range``: the decoders fuzzed against the card's types.

An episode of model calls with token ids, logprobs, weight versions, a reward and
scores drawn from the whole integer and float range goes through the assembler's
per-message path (decode, assemble, score, publish); the rows of every typed
output it gives are read back the two ways readers do: the sink's Parquet
transcoding, and ``datasets``' JSON loading (Arrow's JSON reader, then a cast to
the card's features). Neither may fail, and no float32 may turn into infinity.
"""

from __future__ import annotations

import importlib
import io
import json
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pj
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_export.contract.decoding import decode_episode
from stream_export.contract.widths import FLOAT32_MAX, INT32_MAX, INT64_MAX, INT64_MIN
from stream_export.errors import DecodeError
from stream_export.output import formatter, parquet
from stream_export.rows import formats, schema
from stream_export.runtime.metrics import Metrics
from stream_export.settings.assemble import AssembleSettings
from stream_export.settings.format import FormatSettings
from stream_export.settings.scores import ScoreSettings
from tests.support.assemble_sim import TICK, Pipeline

NOW = 1_700_000_000.0
EDGES = [INT32_MAX, INT32_MAX + 1, 2**31 + 537, INT64_MAX, INT64_MAX + 1, 2**64 + 5]
counts = st.sampled_from([0, 1, *EDGES]) | st.integers(min_value=0)
integers = st.sampled_from([INT64_MIN, INT64_MIN - 1, *EDGES]) | st.integers()
floats = st.sampled_from([FLOAT32_MAX, -FLOAT32_MAX, 3.5e38, -1e39, -3.36e-6, 1e-46, 5e-324])
floats |= st.floats(allow_nan=False, allow_infinity=False)
#: Every typed output of an episode, as the sink writes it.
TYPED = [
    FormatSettings(format="tokens", metadata_mode="columns"),
    FormatSettings(format="tokens", metadata_mode="nested"),
    FormatSettings(format="text", metadata_mode="columns"),
    FormatSettings(format="conversational", metadata_mode="columns", granularity="step"),
]


def _call(
    seq: int, prompt: list[int], completion: list[int], lps: list[float], version: Any
) -> str:
    call = {
        "request": {"messages": [{"role": "user", "content": "hi"}]},
        "response": {"content": "yo"},
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "logprobs": lps,
        "model": "m",
        "weight_version": version,
        "finish_reason": "stop",
        "request_id": f"r{seq}",
        **({"prompt_base": seq - 1} if seq else {}),
    }
    step = {"type": "step", "episode_id": "e", "time": NOW, "seq": seq, "kind": "llm_call"}
    return json.dumps({**step, "call": call})


def _score(score_id: str, seq: int, value: float) -> str:
    return json.dumps(
        {
            "type": "score",
            "episode_id": "e",
            "time": NOW,
            "score_id": score_id,
            "name": "judge",
            "value": value,
            "evaluator": {"id": "j"},
            "seq": seq,
        }
    )


def _fit(ids: list[int], lps: list[float], version: Any) -> bool:
    in_int64 = not isinstance(version, int) or INT64_MIN <= version <= INT64_MAX
    return all(i <= INT32_MAX for i in ids) and all(abs(x) <= FLOAT32_MAX for x in lps) and in_int64


def readable(lines: list[bytes], columns: pa.Schema, tmp: Path) -> list[dict[str, Any]]:
    """The rows as the Parquet transcoding and ``datasets``' JSON loader read them
    (each raises on a value its column cannot hold)."""
    table_cast = importlib.import_module("datasets.table").table_cast
    src = tmp / "rows.jsonl"
    src.write_bytes(b"".join(line + b"\n" for line in lines))
    out = io.BytesIO()
    parquet.transcode(src, out, columns, "zstd")
    inferred = pj.read_json(src)
    as_text = [f for f in columns if "weight_version" in f.name]
    for field in as_text:  # datasets reads a JSON int column as int, then casts to text
        i = inferred.schema.get_field_index(field.name)
        if i >= 0:
            inferred = inferred.set_column(i, field.name, inferred[field.name].cast(field.type))
    typed = table_cast(inferred, pa.schema([columns.field(n) for n in inferred.column_names]))
    rows: list[dict[str, Any]] = typed.to_pylist()
    return rows


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(map(_finite, value))
    if isinstance(value, dict):
        return all(map(_finite, value.values()))
    return True


@given(
    prompt=st.lists(counts, min_size=1, max_size=3),
    completion=st.lists(st.tuples(counts, floats), min_size=1, max_size=3),
    version=integers | st.text(max_size=4),
    delta=st.tuples(counts, counts, floats),
    reward=floats,
    score_seq=counts,
    score=floats,
)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_what_a_decoder_accepts_fits_every_typed_output_and_the_rest_is_out_of_range(
    tmp_path_factory: pytest.TempPathFactory,
    prompt: list[int],
    completion: list[tuple[int, float]],
    version: int | str,
    delta: tuple[int, int, float],
    reward: float,
    score_seq: int,
    score: float,
) -> None:
    ids, lps = [c for c, _ in completion], [lp for _, lp in completion]
    added, answer, answer_lp = delta
    start = {"type": "start", "episode_id": "e", "time": NOW, "agent_id": "a", "prompt": "p"}
    end = {"type": "end", "episode_id": "e", "time": NOW, "steps": 2, "outcome": "success"}
    messages = [
        json.dumps(start),
        _call(0, prompt, ids, lps, version),
        _call(1, [added], [answer], [answer_lp], 3),
        _score("before", score_seq, score),
        json.dumps({**end, "reward": reward}),
        _score("after", score_seq, score),
    ]
    fits = {
        1: _fit(prompt + ids, lps, version),
        2: _fit([added, answer], [answer_lp], 3),
        3: score_seq <= INT64_MAX,
        5: score_seq <= INT64_MAX,
    }
    pipeline = Pipeline(
        AssembleSettings(idle_timeout_s=50),
        scores=ScoreSettings(enabled=True),
    )
    pipeline.batch([(i, (b"e", m.encode())) for i, m in enumerate(messages)], NOW)
    pipeline.batch([(len(messages), TICK)], NOW + 1000)  # closes it, whatever is missing

    out_of_range = {offset for reason, offset in pipeline.dead if reason == "out_of_range"}
    assert out_of_range == {offset for offset, ok in fits.items() if not ok}, pipeline.dead
    [episode] = pipeline.emitted
    tmp = tmp_path_factory.mktemp("rows")
    for fmt in TYPED:
        lines = formatter.build(fmt, Metrics())(episode)
        columns = schema.episode_schema(fmt)
        assert columns is not None
        assert all(map(_finite, readable(lines, columns, tmp))) if lines else True
    late = [formats.encode(row) for row in pipeline.late_scores]
    complete = fits[1] and fits[2]  # else its end waits for the missing step: no late score
    assert len(late) == (complete and fits[5])
    assert all(map(_finite, readable(late, schema.score_schema(), tmp))) if late else True


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("input_ids", 2**31 + 537),
        ("input_ids", 2**64 + 5),
        ("logprobs", -1e39),
        ("weight_version_max", 2**63),
        ("seq", 2**64),
    ],
)
def test_an_episode_on_the_episodes_topic_is_held_to_the_same_widths(
    where: str, value: float
) -> None:
    """The sink decodes the episodes topic with the same bounded types: an episode a
    hostile or older producer put there with a number out of range is a dead letter."""
    segment: dict[str, Any] = {
        "input_ids": [1, 2, 3],
        "calls": [{"seq": 0, "start": 2, "end": 3, "weight_version": 1}],
        "logprobs": [-0.5],
        "weight_version_min": 1,
        "weight_version_max": 1,
    }
    episode: dict[str, Any] = {
        "episode_id": "e",
        "agent_id": "a",
        "prompt": "p",
        "steps": [],
        "start_time": NOW,
        "end_time": NOW,
        "outcome": "success",
        "tokens": {"segments": [segment]},
    }
    assert decode_episode(json.dumps(episode).encode()).tokens is not None
    if where == "seq":
        segment["calls"][0]["seq"] = value
    elif where in ("input_ids", "logprobs"):
        segment[where] = [value] if where == "logprobs" else [1, 2, value]
    else:
        segment[where] = value
    with pytest.raises(DecodeError) as caught:
        decode_episode(json.dumps(episode).encode())
    assert caught.value.reason == "out_of_range", caught.value
