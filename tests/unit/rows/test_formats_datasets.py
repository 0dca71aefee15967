"""Written files load with Hugging Face ``datasets`` exactly as ML engineers load them.

Offline: local JSON files need no hub, and the test proves it by forbidding it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.golden import GOLDEN_CASES, golden_episodes, is_trl_conversational, run
from tests.support.hf_datasets import load_json

__all__ = ["load_json"]  # the fixture, shared


@pytest.mark.parametrize("case", sorted(GOLDEN_CASES))
def test_every_format_loads_with_datasets(case: str, load_json: Any, tmp_path: Path) -> None:
    episodes = golden_episodes()
    settings = GOLDEN_CASES[case]
    files = []
    # Two files, like two sealed rotations of the same worker.
    for i, part in enumerate([episodes, episodes[::-1]]):
        path = tmp_path / f"training-data-{i}.jsonl"
        path.write_bytes(b"".join(line + b"\n" for line in run(part, **settings)))
        files.append(path)
    expected = [json.loads(line) for f in files for line in f.read_bytes().splitlines()]

    dataset = load_json(files)

    assert dataset.num_rows == len(expected) > 0
    fmt = settings.get("format", "text")
    assert ("messages" if fmt == "messages" else "prompt") in dataset.column_names
    assert list(dataset) == expected
    if fmt == "text":
        assert {dataset.features[c].dtype for c in ("prompt", "completion")} == {"string"}
    if fmt == "conversational":
        for row in dataset:
            assert is_trl_conversational(row["prompt"])
            assert is_trl_conversational(row["completion"])
    if fmt == "messages":
        assert all(is_trl_conversational(row["messages"]) for row in dataset)
    if fmt == "episode":
        assert all(row["steps"] and row["prompt"][0]["content"] for row in dataset)
    if settings.get("metadata_mode", "columns") == "columns" and fmt != "episode":
        assert dataset.features["reward"].dtype == "float64"
        assert dataset.features["group_id"].dtype == "string"


# The episode format carries the agent's free-form JSON (step data, metadata), which
# no fixed column type can hold: its files load together only with features=.
@pytest.mark.parametrize("case", sorted(c for c in GOLDEN_CASES if not c.startswith("episode-")))
def test_files_with_and_without_truncated_or_grouped_episodes_load_together(
    case: str, load_json: Any, tmp_path: Path
) -> None:
    """The first file has no truncated episode and no group id, so a column that
    could be null there (truncated_reason, group_id, the labels) would have no type
    and the next file, which has them, would not load with it."""
    episodes = golden_episodes()
    plain = [e for e in episodes if not e.truncated and e.group_id is None]
    assert plain and len(plain) < len(episodes)
    files = []
    for i, part in enumerate([plain, episodes]):
        path = tmp_path / f"training-data-{i}.jsonl"
        path.write_bytes(b"".join(line + b"\n" for line in run(part, **GOLDEN_CASES[case])))
        files.append(path)
    expected = [json.loads(line) for f in files for line in f.read_bytes().splitlines()]

    dataset = load_json(files)

    assert list(dataset) == expected
    if GOLDEN_CASES[case].get("metadata_mode", "columns") == "columns":
        for column in ("truncated_reason", "group_id", "domain", "difficulty"):
            if column in dataset.column_names:
                assert dataset.features[column].dtype == "string", column
