"""The ``tokens`` format, and the text / conversational formats of episodes with model
calls: rows checked against the calls as they were sent (full prompts, never the
deltas), turned into the tensors trainers consume, and loaded with ``datasets``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from trl.data_utils import is_conversational

from stream_export.assemble.tokens import token_plane
from stream_export.contract.calls import text_only
from stream_export.contract.episode import Episode
from stream_export.errors import ConfigError
from stream_export.output import formatter
from stream_export.rows.groups import group_token_records
from stream_export.rows.tokens import TOKEN_COLUMNS
from stream_export.runtime.metrics import Metrics
from stream_export.settings.format import FormatSettings
from tests.support.call_episodes import CALL_1, TOOLS, full_prompts, tool_episode
from tests.support.golden import by_id, filtered, run
from tests.support.group_records import record
from tests.support.hf_datasets import load_json
from tests.support.token_calls import Call, conversations, episode_steps, expected

__all__ = ["load_json"]  # the fixture, shared


def rows(episodes: list[Episode], **settings: Any) -> list[dict[str, Any]]:
    return [json.loads(line) for line in run(episodes, **settings)]


def test_a_tokens_row_is_the_calls_sent_token_for_token() -> None:
    (p1, c1), (p2, c2) = full_prompts()
    [row] = rows([tool_episode(versions=(3, 5))], format="tokens")
    assert row["input_ids"] == p2 + c2
    sampled = set(range(len(p1), len(p1) + len(c1))) | set(range(len(p2), len(p2) + len(c2)))
    assert row["loss_mask"] == [int(i in sampled) for i in range(len(p2) + len(c2))]
    assert row["logprobs"] == [0.0] * len(p1) + [-0.25, -0.5, -0.75] + [0.0] * 3 + [-0.25, -0.5]
    assert (row["prompt_len"], row["weight_version_min"], row["weight_version_max"]) == (4, 3, 5)
    assert (row["episode_id"], row["segment"], row["reward"]) == ("tools-1", 0, 1.0)
    assert (row["outcome"], row["group_id"]) == ("success", "")
    # each call: where its completion sits, and the version that served it
    assert (row["call_starts"], row["call_ends"]) == ([4, 10], [7, 12])
    assert row["call_weight_versions"] == [3, 5]
    spans = list(zip(row["call_starts"], row["call_ends"], strict=True))
    for start, end in spans:
        assert row["loss_mask"][start:end] == [1] * (end - start)
    assert sum(row["loss_mask"]) == sum(end - start for start, end in spans)
    # the metadata columns follow the token columns, none twice
    assert list(row)[: len(TOKEN_COLUMNS)] == list(TOKEN_COLUMNS)
    assert row["domain"] == "rooms" and len(row) == len(set(row))


def trainer_batch(table: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """What TRL's async GRPO collator builds from TrainingSequence rows (input ids,
    completion mask, old logprobs, right-padded), with verl's prompt/response split."""
    width = max(len(r["input_ids"]) for r in table)

    def pad(key: str, dtype: Any) -> np.ndarray:
        return np.array([r[key] + [0] * (width - len(r[key])) for r in table], dtype=dtype)

    return {
        "input_ids": pad("input_ids", np.int64),
        "completion_mask": pad("loss_mask", np.int64),
        "old_log_probs": pad("logprobs", np.float32),
    }


@given(conversations())
@settings(max_examples=300, deadline=None)
def test_rows_become_the_tensors_a_trainer_consumes(conversation: tuple[list[Call], int]) -> None:
    calls, count = conversation
    plane = token_plane(episode_steps("e", calls, count))
    if plane is None:
        return
    episode = tool_episode("e")
    episode = msgspec.structs.replace(episode, steps=plane.steps, tokens=plane.tokens)
    table = rows([episode], format="tokens")
    want = expected(calls).segments
    assert [r["segment"] for r in table] == list(range(len(want)))
    if not table:
        return
    batch = trainer_batch(table)
    for i, (row, ref) in enumerate(zip(table, want, strict=True)):
        n = len(ref["input_ids"])
        ids, mask = batch["input_ids"][i], batch["completion_mask"][i]
        old = batch["old_log_probs"][i]
        assert ids[:n].tolist() == ref["input_ids"] and not mask[n:].any()
        on = mask[:n] == 1
        sampled = [t for _, completion in ref["sampled"] for t in completion]
        assert ids[:n][on].tolist() == sampled
        assert old[:n][on].tolist() == pytest.approx(ref["logprobs"])
        assert not old[:n][~on].any()
        # verl's AgentLoopOutput: prompt_ids, then response ids / mask / logprobs
        start = ref["sampled"][0][0]
        assert row["prompt_len"] == start
        assert ids[:start].tolist() == ref["input_ids"][:start]
        assert not mask[:start].any()


def test_an_episode_without_calls_has_no_tokens_row() -> None:
    metrics = Metrics()
    assert run([by_id("seed-result")], metrics, format="tokens") == []
    assert filtered(metrics, "empty") == 1


@pytest.mark.parametrize(
    "settings",
    [
        {"format": "tokens", "granularity": "step"},
        {"format": "tokens", "metadata_fields": ["agent_id", "loss_mask"]},
    ],
)
def test_tokens_refuse_per_decision_rows_and_a_column_twice(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        formatter.build(FormatSettings(metadata_mode="columns", **settings), Metrics())


def test_nested_metadata_and_none_keep_the_token_columns() -> None:
    [nested] = rows([tool_episode()], format="tokens", metadata_mode="nested")
    assert list(nested) == [*TOKEN_COLUMNS, "metadata"]
    assert nested["metadata"]["agent_id"] == "agent"
    [bare] = rows([tool_episode()], format="tokens", metadata_mode="none")
    assert list(bare) == list(TOKEN_COLUMNS)


def test_conversational_rows_of_calls_carry_openai_tool_calls_and_tools() -> None:
    [row] = rows([tool_episode()], format="conversational", metadata_mode="none")
    assert is_conversational(row) and json.loads(row["tools"]) == TOOLS
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    first, tool, last = row["completion"]
    assert first["tool_calls"] == [{**CALL_1, "type": "function"}]
    assert (tool["role"], tool["tool_call_id"], tool["content"]) == (
        "tool",
        "call_1",
        "It is open.",
    )
    assert (last["role"], last["content"], last["tool_calls"]) == ("assistant", "I am out.", None)
    # every message has the same keys, so the column has one type
    assert {tuple(m) for m in row["prompt"] + row["completion"]} == {
        ("role", "content", "name", "tool_calls", "tool_call_id")
    }
    per_call = rows([tool_episode()], format="conversational", granularity="step")
    assert [len(r["prompt"]) for r in per_call] == [2, 4]
    assert [r["completion"][0]["content"] for r in per_call] == ["", "I am out."]
    [whole] = rows([tool_episode()], format="messages", metadata_mode="none")
    assert whole == {"messages": row["prompt"] + row["completion"], "tools": row["tools"]}


def test_text_only_calls_make_no_tokens_rows_and_the_same_conversational_rows() -> None:
    """Calls recorded without token ids (a hosted model behind the gateway): the
    assembler builds no token plane from them, so there are no tokens rows, and the
    conversation reads as it does with token ids."""
    with_ids = tool_episode()
    assert all(s.call is None or text_only(s.call) for s in with_ids.steps)  # as recorded
    plane = token_plane(with_ids.steps)
    assert plane is not None and plane.tokens.segments == [] and plane.steps == with_ids.steps
    hosted = msgspec.structs.replace(with_ids, tokens=plane.tokens)
    assert rows([hosted], format="tokens") == []
    for granularity in ("episode", "step"):
        shape = {"format": "conversational", "granularity": granularity}
        assert rows([hosted], **shape) == rows([with_ids], **shape)


def test_text_rows_of_calls_read_like_text_steps() -> None:
    [row] = rows([tool_episode()], metadata_mode="none")
    assert row == {
        "prompt": "You are in a dark room.\n\nGet out.",
        "completion": '\n\nA door north.\n\nAction: open_door({"direction":"north"})'
        "\n\nIt is open.\n\nIt opened.\n\nI am out.",
    }


@pytest.mark.parametrize("fmt", ["tokens", "conversational", "messages", "text"])
def test_rows_of_calls_load_with_datasets(fmt: str, load_json: Any, tmp_path: Path) -> None:
    """Two files, as two sealed rotations: string and integer weight versions kept
    apart (a column has one type), rewards in both."""
    parts = [
        [tool_episode("a", group_id="g"), tool_episode("b", versions=(7, 7), offset=5)],
        [tool_episode("c", reward=0.0, versions=(1, 2))],
    ]
    files = []
    for i, part in enumerate(parts):
        path = tmp_path / f"training-data-{i}.jsonl"
        path.write_bytes(b"".join(line + b"\n" for line in run(part, format=fmt)))
        files.append(path)
    expected_rows = [json.loads(line) for f in files for line in f.read_bytes().splitlines()]
    dataset = load_json(files)
    assert list(dataset) == expected_rows and len(expected_rows) == 3
    if fmt == "tokens":
        assert dataset.features["input_ids"].feature.dtype == "int64"
        assert dataset.features["logprobs"].feature.dtype == "float64"
        assert dataset.features["weight_version_max"].dtype == "int64"


def test_a_closed_groups_tokens_rows_carry_each_rollouts_advantage() -> None:
    """One row per segment of each scored rollout, with its advantage; a truncated
    rollout (advantage None) and a late record give none."""
    rollouts = [
        tool_episode("a", group_id="g", reward=1.0),
        tool_episode("b", group_id="g", reward=0.0),
        tool_episode("c", group_id="g", reward=None),
    ]
    made = record(rollouts, 3, estimator="grpo")
    truncated = msgspec.structs.replace(made, advantages=[*made.advantages[:2], None])
    rows = group_token_records(truncated)
    assert [(r["episode_id"], r["group_id"]) for r in rows] == [("a", "g"), ("b", "g")]
    assert [r["advantage"] for r in rows] == made.advantages[:2]
    assert rows[0]["advantage"] > 0 > rows[1]["advantage"]
    assert all(list(r)[: len(TOKEN_COLUMNS)] == list(TOKEN_COLUMNS) for r in rows)
    late = msgspec.structs.replace(made, close_reason="late")
    assert group_token_records(late) == []
