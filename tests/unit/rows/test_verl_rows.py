"""verl rows of closed groups (``stream-export export --to FILE.parquet``) and the
opt-in dropping of zero-variance groups: hand-built groups -> exact rows."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stream_export.contract.episode import Episode
from stream_export.contract.events import ChatMessage
from stream_export.rows.groups import dropped_for_variance, verl_row, verl_rows
from stream_export.rows.schema import verl_schema
from stream_export.settings.groups import GroupSettings
from tests.support.group_records import record, rollout


def with_(episode: Episode, **fields: object) -> Episode:
    return msgspec.structs.replace(episode, **fields)


MATH = {"domain": "math", "ground_truth": 4, "data_source": "openai/gsm8k"}


def test_a_verl_row_takes_prompt_messages_and_ground_truth_from_the_first_rollout() -> None:
    chat = [ChatMessage("system", "Be brief."), ChatMessage("user", "2 + 2?", name="kid")]
    first = with_(rollout("a", 1.0), prompt=chat, metadata=MATH)
    group = record([first, rollout("b", 0.0), rollout("c", 0.5)], 3)
    prompt = {"prompt": "ignored", "group_id": "g", "pass_rate": 0.5, "mean_reward": 0.5}
    assert verl_row(group, {**prompt, "scored": 3}, 7) == {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "2 + 2?"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "4"},
        "extra_info": {
            "index": 7,
            "group_id": "g",
            "pass_rate": 0.5,
            "mean_reward": 0.5,
            "scored": 3,
            "completions": ["answer a", "answer b", "answer c"],
            "rewards": [1.0, 0.0, 0.5],
        },
    }


@pytest.mark.parametrize(
    ("metadata", "data_source", "ability", "truth"),
    [
        ({}, "stream-export", "unknown", ""),
        (
            {"domain": "text-adventure", "answer": "north"},
            "stream-export/text-adventure",
            "text-adventure",
            "north",
        ),
        ({"domain": "math", "difficulty": "easy"}, "stream-export/math", "math", ""),
        ({"domain": 7, "answer": 12}, "stream-export/7", "7", "12"),
        ({"answer": [1, 2], "ground_truth": None}, "stream-export", "unknown", "[1,2]"),
    ],
)
def test_verl_fallbacks_are_text(
    metadata: dict[str, object], data_source: str, ability: str, truth: str
) -> None:
    group = record([with_(rollout("a", 1.0), metadata=metadata), rollout("b", 0.0)], 2)
    [row] = verl_rows([group], GroupSettings())
    assert row["prompt"] == [{"role": "user", "content": "What is 2 + 2?"}]
    assert (row["data_source"], row["ability"]) == (data_source, ability)
    assert row["reward_model"] == {"style": "rule", "ground_truth": truth}


def test_verl_rows_keep_the_prompts_band_and_number_what_they_keep() -> None:
    solved = record([rollout("a", 1.0), rollout("b", 1.0)], 2)
    half = msgspec.structs.replace(record([rollout("c", 1.0), rollout("d", 0.0)], 2), group_id="h")
    settings = GroupSettings(prompts_min_pass_rate=0.0, prompts_max_pass_rate=1.0)
    assert [
        (r["extra_info"]["group_id"], r["extra_info"]["index"])
        for r in verl_rows([solved, half], settings)
    ] == [("h", 0)]
    everything = verl_rows([solved, half], GroupSettings())
    assert [r["extra_info"]["index"] for r in everything] == [0, 1]
    assert everything[1]["extra_info"] == {
        "index": 1,
        "group_id": "h",
        "pass_rate": 0.5,
        "mean_reward": 0.5,
        "scored": 2,
        "completions": ["answer c", "answer d"],
        "rewards": [1.0, 0.0],
    }


def test_zero_variance_groups_are_dropped_on_reward_or_on_outcome_when_asked() -> None:
    equal = record([rollout("a", 1.0), rollout("b", 1.0)], 2)
    # rewards differ, outcomes do not (both above zero: success)
    same_outcome = record([rollout("c", 1.0), rollout("d", 0.5)], 2)
    mixed = record([rollout("e", 1.0), rollout("f", 0.0)], 2)
    late = record([rollout("g", 1.0)], None, reason="late", complete=False, missing=None)
    drops = {
        on: [dropped_for_variance(r, on) for r in (equal, same_outcome, mixed, late)]
        for on in ("none", "reward", "outcome")
    }
    assert drops == {
        "none": [False, False, False, False],
        "reward": [True, False, False, False],
        "outcome": [True, True, False, False],
    }
    kept = verl_rows([equal, same_outcome, mixed], GroupSettings(drop_zero_variance="outcome"))
    assert [r["extra_info"]["index"] for r in kept] == [0]


def test_verl_rows_fit_their_parquet_schema(tmp_path: Path) -> None:
    rows = verl_rows([record([rollout("a", 1.0), rollout("b", 0.0)], 2)], GroupSettings())
    pq.write_table(pa.Table.from_pylist(rows, schema=verl_schema()), tmp_path / "x.parquet")
    assert pq.read_table(tmp_path / "x.parquet").to_pylist() == rows
