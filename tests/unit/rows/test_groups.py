"""The group outputs (group, rollout, DPO and KTO rows): scored rollouts only, no
nulls, and files of each load with ``datasets`` without ``features=``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stream_export.contract.decoding import decode_record
from stream_export.contract.groups import Estimator
from stream_export.errors import ConfigError, DecodeError
from stream_export.groups.advantages import ESTIMATORS
from stream_export.groups.stage import outputs
from stream_export.rows.groups import (
    group_row,
    kto_rows,
    preference_rows,
    prompt_rows,
    rollout_rows,
)
from stream_export.settings.groups import GroupSettings
from tests.support import rewards as reward_groups
from tests.support.group_records import OUTPUTS, SEP, record, rollout
from tests.support.hf_datasets import load_json

__all__ = ["load_json"]  # the fixture, shared
group_reader = OUTPUTS["groups"]


def test_a_group_row_holds_the_scored_rollouts_index_aligned() -> None:
    episodes = [rollout("a", 1.0), rollout("b", 0.0), rollout("c", 5.0, truncated=True)]
    row = group_row(record(episodes, 3))
    assert row == {
        "group_id": "g",
        "prompt": "What is 2 + 2?",
        "completions": ["answer a", "answer b"],
        "episode_ids": ["a", "b"],
        "rewards": [1.0, 0.0],
        "advantages": [0.5, -0.5],
        "outcomes": ["success", "failure"],
        "size": 3,
        "expected_size": 3,
        "complete": True,
        "close_reason": "size",
        "missing": 0,
        "truncated": 1,
        "duplicates": 0,
        "mean": 0.5,
        "std": pytest.approx(0.7071067811865476),
        "zero_variance": False,
        "estimator": "dr_grpo",
        "eps": 1e-6,
    }


def test_a_late_rollout_has_no_group_row_and_bad_input_is_a_decode_error() -> None:
    late = record([rollout("x", 1.0)], None, reason="late", complete=False, missing=None)
    assert group_row(late) is None
    assert group_reader(msgspec.json.encode(late)) == ("g/late/x", [], 2.0, None, None)
    with pytest.raises(DecodeError):
        group_reader(b'{"not": "a group"}')


def test_rollout_rows_carry_their_group_like_verls_uid() -> None:
    episodes = [rollout("a", 1.0), rollout("b", 0.0), rollout("c", 5.0, truncated=True)]
    rows = rollout_rows(record(episodes, 3), SEP)
    assert [(r["episode_id"], r["uid"], r["advantage"]) for r in rows] == [
        ("a", "g", 0.5),
        ("b", "g", -0.5),
    ]
    assert rows[0]["prompt"] == "What is 2 + 2?" and rows[0]["completion"] == "\n\nanswer a"
    late = record([rollout("x", 1.0)], None, reason="late", complete=False, missing=None)
    [alone] = rollout_rows(late, SEP)
    assert (alone["advantage"], alone["zero_variance"], alone["close_reason"]) == (
        0.0,
        True,
        "late",
    )


def test_preference_pairs_best_against_worst_above_the_margin() -> None:
    episodes = [rollout("a", 0.5), rollout("b", 1.0), rollout("c", 0.0)]
    [pair] = preference_rows(record(episodes, 3), 0.0, SEP)
    assert (pair["chosen"], pair["rejected"], pair["margin"]) == (
        "\n\nanswer b",
        "\n\nanswer c",
        1.0,
    )
    assert pair["prompt"] == "What is 2 + 2?"
    assert preference_rows(record(episodes, 3), 1.0, SEP) == []  # not above it
    assert preference_rows(record([rollout("a", 1.0), rollout("b", 1.0)], 2), 0.0, SEP) == []


def test_preference_never_pairs_a_text_with_itself() -> None:
    same = msgspec.structs.replace(rollout("c", 0.0), steps=rollout("b", 0.0).steps)
    episodes = [rollout("a", 0.5), rollout("b", 1.0), same]
    [pair] = preference_rows(record(episodes, 3), 0.0, "")
    assert (pair["chosen"], pair["rejected"], pair["margin"]) == ("answer b", "answer a", 0.5)
    only_same = [rollout("b", 1.0), same]
    assert preference_rows(record(only_same, 2), 0.0, SEP) == []


def test_kto_labels_say_better_than_the_group() -> None:
    rows = kto_rows(record([rollout("a", 1.0), rollout("b", 0.0)], 2), " ")
    assert [(r["completion"], r["label"]) for r in rows] == [
        (" answer a", True),
        (" answer b", False),
    ]
    assert kto_rows(record([rollout("a", 1.0), rollout("b", 1.0)], 2), SEP) == []


@pytest.mark.parametrize("name", sorted(OUTPUTS))
def test_every_output_loads_with_datasets_without_features(
    name: str, load_json: Any, tmp_path: Path
) -> None:
    # The first file's groups announce no size, one is all equal, one truncated:
    # no column may be null-typed there, or the second file would not cast.
    first = [
        record([rollout("a", 1.0), rollout("b", 1.0)], None, reason="timeout", complete=False),
        record(
            [rollout("c", None), rollout("d", 1.0), rollout("t", 1.0, truncated=True)],
            None,
            reason="timeout",
            complete=False,
        ),
    ]
    second = [
        record([rollout("e", 1.0), rollout("f", 0.0), rollout("g", 0.5)], 3),
        record([rollout("x", 1.0)], None, reason="late", complete=False, missing=None),
    ]
    read = OUTPUTS[name]
    files = []
    for i, records in enumerate([first, second]):
        path = tmp_path / f"training-data.{name}-{i}.jsonl"
        lines = [line for r in records for line in read(msgspec.json.encode(r))[1]]
        path.write_bytes(b"".join(line + b"\n" for line in lines))
        files.append(path)
    expected = [msgspec.json.decode(line) for f in files for line in f.read_bytes().splitlines()]
    assert expected
    dataset = load_json(files)
    assert list(dataset) == expected
    if name == "groups":
        assert dataset.features["advantages"].feature.dtype == "float64"
        assert dataset.features["expected_size"].dtype == "int64"
    if name == "preference":
        assert {"prompt", "chosen", "rejected"} <= set(dataset.column_names)
    if name == "kto":
        assert dataset.features["label"].dtype == "bool"


def test_a_prompt_row_gives_the_pass_rate_of_the_scored_rollouts() -> None:
    episodes = [
        rollout("a", 1.0),
        rollout("b", 0.0),
        rollout("c", 2.0),
        rollout("d", 5.0, truncated=True),
    ]
    assert prompt_rows(record(episodes, 4)) == [
        {
            "prompt": "What is 2 + 2?",
            "group_id": "g",
            "pass_rate": 2 / 3,
            "mean_reward": 1.0,
            "scored": 3,
        }
    ]


@pytest.mark.parametrize(
    ("low", "high", "kept"),
    [
        (None, None, True),
        (0.5, None, True),  # 2/3 > 0.5
        (2 / 3, None, False),  # strictly above: the bound itself is out
        (None, 2 / 3, False),  # strictly below
        (None, 0.7, True),
        (0.0, 1.0, True),
    ],
)
def test_the_prompts_band_keeps_pass_rates_strictly_between_its_bounds(
    low: float | None, high: float | None, kept: bool
) -> None:
    episodes = [rollout("a", 1.0), rollout("b", 0.0), rollout("c", 2.0)]
    assert bool(prompt_rows(record(episodes, 3), low, high)) is kept


def test_the_default_band_keeps_tasks_every_rollout_passed_or_failed() -> None:
    read = outputs(GroupSettings(), SEP)["prompts"]
    for reward in (0.0, 1.0):
        episodes = [rollout("a", reward), rollout("b", reward)]
        assert read(msgspec.json.encode(record(episodes, 2)))[1]


def test_a_prompts_band_of_all_passed_or_failed_tasks_drops_them() -> None:
    settings = GroupSettings(prompts_min_pass_rate=0.0, prompts_max_pass_rate=1.0)
    read = outputs(settings, SEP)["prompts"]
    for reward in (0.0, 1.0):
        episodes = [rollout("a", reward), rollout("b", reward)]
        assert read(msgspec.json.encode(record(episodes, 2)))[1] == []


@pytest.mark.parametrize(("low", "high"), [(0.5, 0.5), (0.8, 0.2)])
def test_a_prompts_band_with_min_not_below_max_is_refused(low: float, high: float) -> None:
    with pytest.raises(ConfigError, match="prompts_min_pass_rate"):
        GroupSettings(prompts_min_pass_rate=low, prompts_max_pass_rate=high)


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_a_prompts_pass_rate_bound_outside_0_1_is_refused(bad: float) -> None:
    with pytest.raises(msgspec.ValidationError):
        msgspec.convert({"prompts_min_pass_rate": bad}, GroupSettings)


def no_nulls(value: object) -> bool:
    if isinstance(value, dict):
        return all(map(no_nulls, value.values()))
    if isinstance(value, list):
        return all(map(no_nulls, value))
    return value is not None


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reward_groups.rewards, st.sampled_from(ESTIMATORS))
def test_every_output_takes_the_record_of_any_finite_rewards(
    rewards: list[float], estimator: Estimator
) -> None:
    # A record's non-finite number is written as null, which its own decoder then
    # refuses; a row's is a null in a column typed as a number.
    episodes = [rollout(f"r{i}", reward) for i, reward in enumerate(rewards)]
    made = record(episodes, len(episodes), estimator)
    value = msgspec.json.encode(made)
    assert decode_record(value) == made
    for name, read in OUTPUTS.items():
        record_id, lines, *_ = read(value)
        assert record_id == "g", name
        rows = [msgspec.json.decode(line) for line in lines]
        assert all(map(no_nulls, rows)), (name, rows)
    [row] = [msgspec.json.decode(line) for line in OUTPUTS["groups"](value)[1]]
    assert row["rewards"] == rewards
