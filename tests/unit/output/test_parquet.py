"""Parquet as the encoding of sealed files: the rows of every output, typed by its
schema, the same whichever path transcodes them; ``follow`` across a Parquet seal;
a folder of Parquet files loads with ``datasets`` without ``features=``."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from stream_export.errors import ConfigError
from stream_export.output import card, parquet
from stream_export.output.follow import Follower
from stream_export.output.layout import read_manifest
from stream_export.output.writer import Writer
from stream_export.rows import schema
from stream_export.rows.columns import GROUP_OUTPUTS
from stream_export.runtime.metrics import Metrics
from stream_export.settings import Settings
from stream_export.settings.format import FormatSettings
from stream_export.settings.sink import SinkSettings
from tests.support.call_episodes import tool_episode
from tests.support.golden import golden_episodes, run
from tests.support.group_records import OUTPUTS
from tests.support.typed_rows import (
    CASES,
    call_episodes,
    conform_row,
    group_records,
    lines,
    transcoded,
)


def case_rows(case: str) -> tuple[FormatSettings, list[bytes]]:
    fmt = FormatSettings(**{"metadata_mode": "columns", **CASES[case]})
    return fmt, run(golden_episodes() + call_episodes(), **CASES[case])


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_format_transcodes_to_its_schema_off_the_gil(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fmt, rows = case_rows(case)
    columns = schema.episode_schema(fmt)
    src = tmp_path / "a.jsonl"
    src.write_bytes(lines(rows))

    def no_fallback(*_: Any) -> Any:
        raise AssertionError("Arrow's reader should have read it")

    monkeypatch.setattr(parquet, "_batches_python", no_fallback)
    assert transcoded(src, columns) == [conform_row(json.loads(r), columns) for r in rows]


@pytest.mark.parametrize("output", sorted(GROUP_OUTPUTS))
def test_every_group_output_transcodes_to_its_schema(output: str, tmp_path: Path) -> None:
    columns = schema.group_schema(output)
    rows = [r for rec in group_records() for r in OUTPUTS[output](msgspec.json.encode(rec)).lines]
    src = tmp_path / "a.jsonl"
    src.write_bytes(lines(rows))
    assert transcoded(src, columns) == [conform_row(json.loads(r), columns) for r in rows]


def test_what_arrow_cannot_read_in_one_pass_takes_the_row_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Integer and string weight versions in one file; a line longer than a block."""
    columns = schema.episode_schema(FormatSettings(format="tokens"))
    episodes = [tool_episode("a", versions=(1, 2)), tool_episode("b", versions=("x", "y"))]
    rows = run(episodes, format="tokens", metadata_mode="none")
    src = tmp_path / "a.jsonl"
    src.write_bytes(lines(rows))
    want = [conform_row(json.loads(r), columns) for r in rows]
    assert [r["weight_version_min"] for r in want] == ["1", "x"]
    assert [r["call_weight_versions"] for r in want] == [["1", "2"], ["x", "y"]]
    assert transcoded(src, columns) == want
    monkeypatch.setattr(parquet, "_BLOCK", 64)
    src.write_bytes(lines(rows[:1]))
    assert transcoded(src, columns) == want[:1]


def test_a_column_outside_the_schema_is_an_error_not_a_silent_drop(tmp_path: Path) -> None:
    columns = schema.episode_schema(FormatSettings())
    src = tmp_path / "a.jsonl"
    src.write_bytes(b'{"prompt": "p", "completion": "c", "surprise": 1}\n')
    with pytest.raises(Exception, match="surprise"):
        transcoded(src, columns)


def test_parquet_needs_a_typed_output_and_no_outer_compression(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="parquet_compression"):
        SinkSettings(encoding="parquet", compression="gzip")
    settings = SinkSettings(output_dir=str(tmp_path), encoding="parquet")
    with pytest.raises(ConfigError, match="needs a typed output"):
        Writer.open(settings, worker_id="w", topic="t", metrics=Metrics())
    columns = schema.episode_schema(FormatSettings())
    Writer.open(settings, worker_id="w", topic="t", metrics=Metrics(), columns=columns).close()


def write(writer: Writer, episodes: list[Any], start: int, fmt: str) -> list[bytes]:
    out = []
    for i, episode in enumerate(episodes, start):
        rows = run([episode], format=fmt)
        writer.append(f"e{i}", rows, partition=0, offset=i, event_time=float(i))
        out += rows
    writer.flush()
    return out


def test_follow_takes_up_a_file_sealed_as_parquet_by_its_records(tmp_path: Path) -> None:
    """A follower half way through the active file when it is sealed into Parquet
    goes on at the next record, and a saved position does too."""
    fmt = FormatSettings(format="conversational", metadata_mode="columns")
    columns = schema.episode_schema(fmt)
    settings = SinkSettings(output_dir=str(tmp_path), encoding="parquet")
    writer = Writer.open(settings, worker_id="w", topic="t", metrics=Metrics(), columns=columns)
    episodes = golden_episodes()[:4] + call_episodes()
    sent = write(writer, episodes[:4], 0, "conversational")
    follower = Follower(tmp_path, wait=False)
    got = [line for _, line in zip(range(2), follower, strict=False)]
    saved = follower.position.copy()
    writer.seal_all()
    sent += write(writer, episodes[4:], 4, "conversational")
    got += list(Follower(tmp_path, position=saved, wait=False))
    writer.close()
    [entry] = read_manifest(tmp_path, "training-data")
    assert entry.encoding == "parquet" and entry.compression == "zstd"
    assert entry.name.endswith(".parquet") and entry.records == 4
    parsed = [conform_row(json.loads(line), columns) for line in got]
    assert parsed == [conform_row(json.loads(line), columns) for line in sent]


def test_a_folder_of_parquet_files_loads_without_features(tmp_path: Path) -> None:
    """Two workers' files: one of text episodes without rewards or tool calls, one
    of model calls; ``datasets`` reads their Parquet schemas as one, by file names
    and, through the card, by the folder's name."""
    datasets = importlib.import_module("datasets")
    fmt = FormatSettings(format="conversational", metadata_mode="columns")
    columns = schema.episode_schema(fmt)
    parts = [[e for e in golden_episodes() if e.reward is None], call_episodes()]
    sent: list[bytes] = []
    sink = SinkSettings(output_dir=str(tmp_path), encoding="parquet")
    for worker, part in zip(("w1", "w2"), parts, strict=True):
        writer = Writer.open(sink, worker_id=worker, topic="t", metrics=Metrics(), columns=columns)
        sent += write(writer, part, len(sent), "conversational")
        writer.seal_all()
        writer.close()
    files = [str(tmp_path / e.name) for e in read_manifest(tmp_path, "training-data")]
    assert len(files) == 2
    cache = str(tmp_path / "hf")
    want = [conform_row(json.loads(line), columns) for line in sent]
    loaded = datasets.load_dataset("parquet", data_files=files, split="train", cache_dir=cache)
    assert list(loaded) == want
    assert loaded.features == datasets.Features.from_arrow_schema(columns)

    card.write(Settings(sink=sink, format=fmt))
    assert "training-data-*.parquet" in (tmp_path / card.NAME).read_text()
    by_folder = datasets.load_dataset(str(tmp_path), split="train", cache_dir=cache)
    assert list(by_folder) == want
