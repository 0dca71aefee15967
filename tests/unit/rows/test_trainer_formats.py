"""What SFT and preference trainers read as is: the ``messages`` format in the shape
verl 0.9's ``MultiTurnSFTDataset`` reads (a parquet ``messages`` column, read with
``pandas.read_parquet(..., dtype_backend="pyarrow")``), and the separator TRL and
OpenRLHF find between a text prompt and its completion when they join them."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
from trl.data_utils import is_conversational

from stream_export.contract.episode import Episode
from stream_export.errors import ConfigError
from stream_export.groups.stage import outputs
from stream_export.output.formatter import build
from stream_export.rows import formats
from stream_export.rows.formats import SEPARATORS
from stream_export.runtime.metrics import Metrics
from stream_export.settings.format import FormatSettings
from stream_export.settings.groups import GroupSettings
from tests.support.golden import by_id, golden_episodes, run
from tests.support.group_records import demo_groups, record, rollout
from tests.support.hf_datasets import load_json

__all__ = ["load_json"]  # the fixture, shared
ROLES = {"system", "user", "assistant", "tool"}


def test_messages_are_the_conversational_prompt_and_completion_in_one_list() -> None:
    episodes = golden_episodes()
    whole = [json.loads(line) for line in run(episodes, format="messages")]
    parts = [json.loads(line) for line in run(episodes, format="conversational")]
    assert len(whole) == len(parts) > 0
    for one, two in zip(whole, parts, strict=True):
        assert one["messages"] == two["prompt"] + two["completion"]
        assert list(one) == ["messages", *formats.DEFAULT_METADATA_FIELDS]
        # TRL's SFTTrainer takes a row with "prompt" as prompt-completion: none here
        assert "prompt" not in one and is_conversational(one)


def test_verls_sft_dataset_reads_the_messages_column_from_parquet(
    load_json: Any, tmp_path: Path
) -> None:
    """The README's recipe: JSONL files -> ``datasets`` -> parquet; then what verl's
    ``MultiTurnSFTDataset`` does: ``pd.read_parquet(dtype_backend="pyarrow")`` and the
    ``messages`` column, each a list of role/content messages with assistant turns."""
    episodes = golden_episodes()
    files = []
    for i, part in enumerate([episodes, episodes[::-1]]):
        path = tmp_path / f"training-data-{i}.jsonl"
        path.write_bytes(b"".join(line + b"\n" for line in run(part, format="messages")))
        files.append(path)
    sft = tmp_path / "sft.parquet"
    load_json(files).to_parquet(str(sft))
    pandas = importlib.import_module("pandas")
    column = pandas.read_parquet(sft, dtype_backend="pyarrow")["messages"]
    conversations = [list(value) for value in column.tolist()]
    expected = [json.loads(line)["messages"] for f in files for line in f.read_text().splitlines()]
    assert [[dict(m) for m in c] for c in conversations] == expected
    for conversation in expected:
        assert conversation[0]["role"] != "assistant"
        assert {m["role"] for m in conversation} <= ROLES
        assert any(m["role"] == "assistant" for m in conversation)
        assert all(isinstance(m["content"], str) and m["content"] for m in conversation)


@pytest.mark.parametrize(
    "settings",
    [
        {"format": "messages", "granularity": "step"},
        {"format": "messages", "metadata_mode": "columns", "metadata_fields": ["messages"]},
    ],
)
def test_messages_refuse_per_decision_records_and_a_messages_metadata_column(
    settings: dict[str, Any],
) -> None:
    with pytest.raises(ConfigError):
        build(FormatSettings(**settings), Metrics())


def demo_math() -> Episode:
    group = next(g for g in demo_groups(6) if g.rollouts[0].metadata["domain"] == "math")
    return group.rollouts[0]


@pytest.mark.parametrize(("choice", "between"), sorted(SEPARATORS.items()))
def test_the_text_separator_stands_where_trainers_join_prompt_and_completion(
    choice: str, between: str
) -> None:
    """TRL (``prompt + completion``) and OpenRLHF (``prompt + response``) join the two
    strings as they are; the completion starts with the chosen separator."""
    formatter = build(FormatSettings(text_separator=choice), Metrics())  # type: ignore[arg-type]
    [line] = formatter(demo_math())
    row = json.loads(line)
    joined = row["prompt"] + row["completion"]
    assert row["prompt"].endswith("Think step by step.")
    assert joined.startswith(row["prompt"] + between + "First add ")
    assert row["completion"] == between + row["completion"].removeprefix(between)


def test_the_default_separator_is_a_blank_line() -> None:
    [line] = build(FormatSettings(), Metrics())(by_id("math-42"))
    row = json.loads(line)
    assert row["completion"].startswith("\n\nFirst add 12 and 30.")
    assert "step by step.First" not in row["prompt"] + row["completion"]


@pytest.mark.parametrize("choice", sorted(SEPARATORS))
def test_group_rows_that_trl_joins_start_with_the_separator(choice: str) -> None:
    between = formats.separator(FormatSettings(text_separator=choice))  # type: ignore[arg-type]
    value = msgspec.json.encode(record([rollout("a", 1.0), rollout("b", 0.0)], 2))
    read = outputs(GroupSettings(), between)
    [pair] = [json.loads(line) for line in read["preference"](value)[1]]
    assert (pair["chosen"], pair["rejected"]) == (between + "answer a", between + "answer b")
    for name in ("kto", "rollouts"):
        rows = [json.loads(line) for line in read[name](value)[1]]
        assert [r["completion"] for r in rows] == [between + "answer a", between + "answer b"]
    [group] = [json.loads(line) for line in read["groups"](value)[1]]
    assert group["completions"] == ["answer a", "answer b"]  # turns of their own
