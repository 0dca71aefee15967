"""Groups of rollouts with model calls: token rows with the group advantage in the
``rollouts`` output, stale rollouts (``groups.max_weight_lag``) flagged or dropped
and reported for the metric, and each sealed file's weight-version range in the
manifest."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest

from stream_export.contract.calls import WeightVersion
from stream_export.contract.episode import Episode
from stream_export.contract.groups import GroupRecord
from stream_export.groups.records import closed_record
from stream_export.groups.stage import outputs
from stream_export.groups.state import OpenGroup, member_of
from stream_export.output.layout import read_manifest
from stream_export.output.writer import Writer
from stream_export.rows import tokens
from stream_export.rows.groups import rollout_rows
from stream_export.runtime.metrics import Metrics
from stream_export.settings.groups import GroupSettings
from tests.support.call_episodes import tool_episode
from tests.support.hf_datasets import load_json
from tests.support.sinkfiles import sink_settings

__all__ = ["load_json"]  # the fixture, shared
SEP = "\n\n"


def rollouts(*specs: tuple[WeightVersion, WeightVersion, float]) -> list[Episode]:
    return [
        tool_episode(f"r{i}", versions=(low, high), reward=reward, group_id="g", offset=i)
        for i, (low, high, reward) in enumerate(specs)
    ]


def closed(episodes: list[Episode], **settings: Any) -> GroupRecord:
    members = [member_of(e, msgspec.json.encode(e)) for e in episodes]
    group = OpenGroup("g", 13.0, len(members), members)
    return closed_record(group, "size", True, 0, 13.0, GroupSettings(**settings))


def read(name: str, made: GroupRecord, **settings: Any) -> Any:
    return outputs(GroupSettings(**settings), SEP)[name](msgspec.json.encode(made))


def test_rollouts_of_calls_are_token_rows_with_the_group_advantage() -> None:
    episodes = rollouts((1, 1, 1.0), (1, 2, 0.0))
    made = closed(episodes)
    table = rollout_rows(made, SEP)
    assert [r["episode_id"] for r in table] == ["r0", "r1"]
    for row, episode, advantage in zip(table, episodes, made.advantages, strict=True):
        [arrays] = tokens.segment_arrays(episode)
        assert {k: row[k] for k in arrays} == arrays
        assert (row["advantage"], row["uid"], row["segment"], row["stale"]) == (
            advantage,
            "g",
            0,
            False,
        )
        assert "prompt" not in row and "completion" not in row
    assert made.advantages == pytest.approx([2**-0.5, -(2**-0.5)], rel=1e-5)  # grpo
    assert made.stale == []  # unchecked by default


def test_token_rollouts_rows_load_with_datasets(load_json: Any, tmp_path: Path) -> None:
    files = []
    for i, made in enumerate(
        [closed(rollouts((1, 1, 1.0), (2, 2, 0.0))), closed(rollouts((3, 4, 0.5)))]
    ):
        path = tmp_path / f"training-data.rollouts-{i}.jsonl"
        path.write_bytes(b"".join(line + b"\n" for line in read("rollouts", made).lines))
        files.append(path)
    expected = [msgspec.json.decode(line) for f in files for line in f.read_bytes().splitlines()]
    dataset = load_json(files)
    assert list(dataset) == expected and len(expected) == 3
    assert dataset.features["input_ids"].feature.dtype == "int64"
    assert dataset.features["advantage"].dtype == "float64"


def test_stale_rollouts_are_flagged_and_still_scored() -> None:
    # oldest versions 1, 5, 9 (the second rollout also used 9): newest 9, lags 8, 4, 0
    episodes = rollouts((1, 1, 1.0), (5, 9, 0.0), (9, 9, 0.5))
    made = closed(episodes, max_weight_lag=4)
    assert made.stale == [True, False, False] and made.stale_policy == "flag"
    assert all(a is not None for a in made.advantages)
    result = read("rollouts", made, max_weight_lag=4)
    rows = [msgspec.json.decode(line) for line in result.lines]
    assert [(r["episode_id"], r["stale"]) for r in rows] == [
        ("r0", True),
        ("r1", False),
        ("r2", False),
    ]
    assert result.versions == (1, 9)
    assert closed(episodes, max_weight_lag=3).stale == [True, True, False]
    assert closed(episodes, max_weight_lag=8).stale == [False, False, False]


def test_dropped_stale_rollouts_leave_the_statistics_and_every_output() -> None:
    episodes = rollouts((1, 1, 1.0), (8, 8, 0.0), (9, 9, 1.0))
    made = closed(episodes, max_weight_lag=2, stale_policy="drop")
    assert made.stale == [True, False, False]
    assert made.advantages[0] is None and made.mean == 0.5
    assert made.truncated == 0 and made.size == 3
    rows = [msgspec.json.decode(line) for line in read("rollouts", made).lines]
    assert [r["episode_id"] for r in rows] == ["r1", "r2"]
    [group] = [msgspec.json.decode(line) for line in read("groups", made).lines]
    assert group["episode_ids"] == ["r1", "r2"]
    assert read("rollouts", made).versions == (8, 9)


def test_only_integer_versions_have_a_lag() -> None:
    # "12" spells an integer (SGLang); "v1" has no lag, and does not count as newest
    episodes = rollouts(("v1", "v1", 1.0), ("12", "12", 0.0), (3, 3, 1.0))
    assert closed(episodes, max_weight_lag=5).stale == [False, False, True]
    only_names = rollouts(("v1", "v1", 1.0), ("v9", "v9", 0.0))
    assert closed(only_names, max_weight_lag=0).stale == [False, False]


def test_the_manifest_records_each_files_weight_version_range(tmp_path: Path) -> None:
    w = Writer.open(
        sink_settings(tmp_path, rotate_records=2), worker_id="w", topic="t", metrics=Metrics()
    )
    ranges: list[tuple[WeightVersion, WeightVersion] | None] = [(3, 5), (2, 4), None, ("v1", "v2")]
    ranges += [None, None]
    for i, versions in enumerate(ranges):
        w.append(f"e{i}", [b"{}"], partition=0, offset=i, event_time=float(i), versions=versions)
    w.seal_all()
    w.close()
    entries = read_manifest(tmp_path, "training-data")
    assert [(e.weight_version_min, e.weight_version_max) for e in entries] == [
        (2, 5),
        ("v1", "v2"),
        (None, None),
    ]
