"""The output folder's dataset card: every built-in output's rows fit its schema, and
``datasets.load_dataset(<output_dir>)`` reads files that infer differently (no
reward, no tool call, text and token episodes, integer and string weight versions)
as one typed dataset, without ``features=``."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from stream_export.output import card
from stream_export.rows import schema
from stream_export.rows.columns import GROUP_OUTPUTS
from stream_export.settings import Settings
from stream_export.settings.format import FormatSettings
from stream_export.settings.groups import GroupSettings
from stream_export.settings.sink import SinkSettings
from tests.support.call_episodes import tool_episode
from tests.support.golden import golden_episodes, run
from tests.support.group_records import OUTPUTS
from tests.support.typed_rows import CASES, call_episodes, conform_row, group_records, lines


def settings_for(root: Path, groups: bool = False, **fmt: Any) -> Settings:
    return Settings(
        sink=SinkSettings(output_dir=str(root)),
        format=FormatSettings(**{"metadata_mode": "columns", **fmt}),
        groups=GroupSettings(enabled=groups),
    )


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_record_fits_its_schema_and_every_column_is_written(case: str) -> None:
    columns = schema.episode_schema(FormatSettings(**{"metadata_mode": "columns", **CASES[case]}))
    assert columns is not None
    rows = [json.loads(line) for line in run(golden_episodes() + call_episodes(), **CASES[case])]
    assert rows
    typed = pa.Table.from_pylist([conform_row(r, columns) for r in rows], schema=columns)
    assert typed.num_rows == len(rows)
    assert set().union(*rows) == set(columns.names)


@pytest.mark.parametrize("output", sorted(GROUP_OUTPUTS))
def test_every_group_row_fits_its_schema_and_every_column_is_written(output: str) -> None:
    columns = schema.group_schema(output)
    import msgspec

    read = OUTPUTS[output]
    rows = [
        json.loads(line) for r in group_records() for line in read(msgspec.json.encode(r)).lines
    ]
    assert rows
    pa.Table.from_pylist([conform_row(r, columns) for r in rows], schema=columns)
    assert set().union(*rows) == set(columns.names)


def test_no_schema_where_the_agents_json_decides_the_types() -> None:
    assert schema.episode_schema(FormatSettings(format="episode")) is None
    own_key = FormatSettings(metadata_mode="columns", metadata_fields=["team"])
    assert schema.episode_schema(own_key) is None
    assert card.text(Settings(format=own_key), ["default"]) is None


@pytest.fixture
def load_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """``datasets.load_dataset(<folder>, <config>)`` with the hub switched off."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    datasets = importlib.import_module("datasets")

    def load(root: Path, config: str | None = None) -> Any:
        cache = str(tmp_path / "hf-cache")
        return datasets.load_dataset(str(root), config, split="train", cache_dir=cache)

    return load


def sealed(root: Path, prefix: str, n: int, suffix: str = "") -> Path:
    return root / f"{prefix}-20261206T0000{n:02d}Z-{n:08d}-w1.jsonl{suffix}"


@pytest.mark.parametrize("fmt", ["conversational", "messages", "text", "tokens"])
def test_a_folder_of_files_that_infer_differently_loads_as_one_dataset(
    fmt: str, tmp_path: Path, load_folder: Any
) -> None:
    """First a file of text episodes without a reward or a tool call (those columns
    null throughout: a reader of that file alone types them as nothing), then one of
    model calls with tool calls (weight versions text in one file, integers in the
    other: one fleet, one kind, but each file has one type); the active
    file, a temporary file and the manifest are not part of the dataset."""
    root = tmp_path / "out"
    root.mkdir()
    (root / "training-data.manifest.jsonl").write_bytes(b'{"file": "x"}\n')
    settings = settings_for(root, format=fmt)
    card.write(settings)
    text_only = [e for e in golden_episodes() if e.reward is None] or golden_episodes()
    first = (
        text_only if fmt != "tokens" else [tool_episode("t", versions=("v1", "v2"), reward=None)]
    )
    parts = [first, call_episodes()]
    written = []
    for n, part in enumerate(parts):
        written.append(run(part, format=fmt))
        sealed(root, "training-data", n).write_bytes(lines(written[-1]))
    (root / "training-data.jsonl").write_bytes(lines(written[0]))  # the active file
    sealed(root, "training-data", 9, ".tmp").write_bytes(b"{")

    dataset = load_folder(root)

    columns = schema.episode_schema(settings.format)
    assert columns is not None
    want = [conform_row(json.loads(line), columns) for part in written for line in part]
    assert len(want) > 2 and list(dataset) == want
    if fmt == "tokens":
        assert dataset.features["input_ids"].feature.dtype == "int32"
        assert dataset.features["logprobs"].feature.dtype == "float32"


def test_group_outputs_load_by_their_config_compressed_too(
    tmp_path: Path, load_folder: Any
) -> None:
    import gzip

    import msgspec

    root = tmp_path / "out"
    root.mkdir()
    (root / "training-data.rollouts.manifest.jsonl").write_bytes(b"{}\n")
    card.write(settings_for(root, groups=True))
    assert '"config_name": "default"' not in (root / card.NAME).read_text()  # no file yet
    text, tokens = (msgspec.json.encode(r) for r in group_records())
    want = []
    for n, value in enumerate([text, tokens]):
        rows = OUTPUTS["rollouts"](value).lines
        sealed(root, "training-data.rollouts", n, ".gz").write_bytes(gzip.compress(lines(rows)))
        want += [conform_row(json.loads(r), schema.group_schema("rollouts")) for r in rows]

    assert list(load_folder(root, "rollouts")) == want


def test_a_readme_it_did_not_write_is_left_alone_its_own_is_kept_current(tmp_path: Path) -> None:
    path = tmp_path / card.NAME
    path.write_text("# my project\n")
    card.write(settings_for(tmp_path))
    assert path.read_text() == "# my project\n"

    path.unlink()
    card.write(settings_for(tmp_path))
    assert not path.exists()  # nothing sealed yet: a card naming no file breaks datasets
    (tmp_path / "training-data.manifest.jsonl").write_bytes(b"{}\n")
    card.write(settings_for(tmp_path))
    first = path.read_text()
    assert first.startswith("---\n") and card.MARKER in first
    stamp = path.stat().st_mtime_ns
    os.utime(path, ns=(stamp - 10**9, stamp - 10**9))
    card.write(settings_for(tmp_path))
    assert path.stat().st_mtime_ns == stamp - 10**9  # unchanged: not rewritten
    card.write(settings_for(tmp_path, format="tokens"))
    assert '"input_ids"' in path.read_text()


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_format_loads_with_the_types_of_its_schema(
    case: str, tmp_path: Path, load_folder: Any
) -> None:
    """The card's features are what ``datasets`` makes of the schema itself."""
    datasets = importlib.import_module("datasets")
    settings = settings_for(tmp_path, **CASES[case])
    (tmp_path / "training-data.manifest.jsonl").write_bytes(b"{}\n")
    card.write(settings)
    sealed(tmp_path, "training-data", 1).write_bytes(lines(run(call_episodes(), **CASES[case])))
    columns = schema.episode_schema(settings.format)
    assert columns is not None
    assert load_folder(tmp_path).features == datasets.Features.from_arrow_schema(columns)


def test_a_worker_card_is_written_again_only_when_another_output_seals_its_first_file(
    tmp_path: Path,
) -> None:
    """The worker refreshes every 10 s: it builds its schemas once and reads only
    which manifests exist; the card is written when that set changes."""
    worker = card.Card(settings_for(tmp_path, groups=True))
    path = tmp_path / card.NAME
    worker.refresh()
    assert not path.exists()
    (tmp_path / "training-data.manifest.jsonl").write_bytes(b"{}\n")
    worker.refresh()
    assert '"config_name": "default"' in path.read_text()
    path.write_text(path.read_text() + "edited\n")
    worker.refresh()  # same outputs: not read, not written
    assert path.read_text().endswith("edited\n")
    (tmp_path / "training-data.groups.manifest.jsonl").write_bytes(b"{}\n")
    worker.refresh()
    text = path.read_text()
    assert '"config_name": "groups"' in text and not text.endswith("edited\n")
