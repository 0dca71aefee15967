"""`stream-export export` replays the episodes topic into a file, a rotated set, or
verl parquet rows of its groups."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pyarrow.parquet as pq
import pytest

from stream_export.contract.episode import Episode
from stream_export.contract.events import ChatMessage
from stream_export.output.layout import read_manifest
from stream_export.settings import Settings
from tests.support.groups import rollout
from tests.support.hf_datasets import load_json
from tests.support.processes import export
from tests.support.sinkkafka import episode, message, prompts, publish

pytestmark = pytest.mark.integration
__all__ = ["load_json"]  # the fixture, shared

DAY = 86_400.0
T0 = 1_700_000_000.0


@pytest.fixture
def published(settings_for: Callable[..., Settings]) -> Settings:
    """300 episodes one day apart from T0, a repeat and a bad message."""
    settings = settings_for("sink.rotate_records=40")
    messages = [message(episode(i, end_time=T0 + i * DAY)) for i in range(300)]
    publish(settings, [*messages, messages[5], (b"bad", b"{")])
    return settings


def test_export_to_a_file_writes_every_episode_once_with_a_progress_bar(
    published: Settings, tmp_path: Path
) -> None:
    target = tmp_path / "all.jsonl"
    done = export(published, "--to", str(target))
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in target.read_text().splitlines()]
    assert Counter(r["prompt"] for r in records) == Counter(f"task {i}" for i in range(300))
    assert "100%" in done.stderr and "302/302 messages" in done.stderr
    assert "300 records from 300 episodes" in done.stderr and "1 repeated, 1 invalid" in done.stderr
    assert not list(tmp_path.glob("*.partial"))


def test_export_time_range_and_format(published: Settings, tmp_path: Path) -> None:
    target = tmp_path / "range.jsonl"
    since, until = "2023-11-24T22:13:20+00:00", str(T0 + 20 * DAY)  # days 10..19
    done = export(published, "--to", str(target), "--since", since, "--until", until)
    assert done.returncode == 0, done.stderr
    got = Counter(json.loads(line)["prompt"] for line in target.read_text().splitlines())
    assert got == Counter(f"task {i}" for i in range(10, 20))
    assert "291 outside the time range, 0 repeated, 1 invalid)" in done.stderr, done.stderr
    bad = export(published, "--to", str(target), "--since", "yesterday")
    assert bad.returncode == 2 and "not a time" in bad.stderr


def test_export_to_a_directory_writes_a_rotated_set_with_a_manifest(
    published: Settings, tmp_path: Path
) -> None:
    target = tmp_path / "set"
    done = export(published, "--to", f"{target}/", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "export [" not in done.stderr, done.stderr
    entries = read_manifest(target, "training-data")
    assert [e.records for e in entries] == [40] * 7 + [20], done.stderr
    assert not (target / "training-data.jsonl").exists()
    assert prompts(target) == Counter(f"task {i}" for i in range(300))
    again = export(published, "--to", f"{target}/")
    assert again.returncode == 2 and "not empty" in again.stderr


def test_export_to_parquet_writes_verl_rows_of_the_groups(
    settings_for: Callable[..., Settings], load_json: Any, tmp_path: Path
) -> None:
    """Rollouts regrouped as the worker would: a full group (chat prompt, ground
    truth), a zero-variance one with a late rollout, one without a size (closed at
    the end), one too small, an ungrouped episode, a repeat and a bad message."""
    settings = settings_for()
    chat = [ChatMessage("system", "Answer briefly."), ChatMessage("user", "What is 2 + 2?")]
    gsm8k = {"domain": "math", "ground_truth": "4", "data_source": "openai/gsm8k"}
    room = {"domain": "text-adventure", "answer": "north"}

    def group(name: str, rewards: list[float], size: int | None, **fields: Any) -> list[Episode]:
        return [
            msgspec.structs.replace(
                rollout(name, i, T0 + i, reward, size or 1), group_size=size, **fields
            )
            for i, reward in enumerate(rewards)
        ]

    half = group("g-half", [1.0, 0.0], 2, prompt=chat, metadata=gsm8k)
    solved = group("g-solved", [1.0] * 4, 3)  # the fourth is late
    sent = [*half, *solved, *group("g-open", [0.0, 1.0], None, metadata=room)]
    sent += [*group("g-small", [1.0], None), episode(99)]
    publish(settings, [*map(message, sent), message(half[0]), (b"bad", b"{")])

    def row(index: int, group_id: str, rewards: list[float], *text: Any) -> dict[str, Any]:
        source, prompt, ability, truth = text
        scored = len(rewards)
        pass_rate = sum(rewards) / scored
        stats = {"pass_rate": pass_rate, "mean_reward": pass_rate, "scored": scored}
        recorded = {"completions": [f"try {i}" for i in range(scored)], "rewards": rewards}
        return {
            "data_source": source,
            "prompt": [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt,
            "ability": ability,
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"index": index, "group_id": group_id, **stats, **recorded},
        }

    system = {"role": "system", "content": "Answer briefly."}
    messages = [system, {"role": "user", "content": "What is 2 + 2?"}]
    rows = [
        # the agent's own data_source is kept; without one, the domain is ours
        row(0, "g-half", [1.0, 0.0], "openai/gsm8k", messages, "math", "4"),
        row(1, "g-open", [0.0, 1.0], "stream-export/text-adventure", "task g-open", *room.values()),
        row(2, "g-solved", [1.0] * 3, "stream-export", "task g-solved", "unknown", ""),
    ]
    target = tmp_path / "verl" / "train.parquet"
    done = export(settings, "--to", str(target), "--quiet")
    assert done.returncode == 0, done.stderr
    got = pq.read_table(target).to_pylist()
    # which three of g-solved's four rollouts arrive first depends on their partitions
    solved = got[2]["extra_info"]["completions"]
    assert solved == sorted(set(solved)) and len(solved) == 3, solved
    assert set(solved) < {f"try {i}" for i in range(4)}, solved
    rows[2]["extra_info"]["completions"] = solved
    assert got == rows
    assert load_json([target], "parquet").to_list() == rows  # no features= needed
    assert "3 verl rows from 3 groups of 7 episodes" in done.stderr, done.stderr
    counted = "1 outside the time range or in no group, 1 repeated, 1 late, 1 invalid; "
    assert counted + "1 groups too small); 1 rows without a ground_truth" in done.stderr
    assert not list(target.parent.glob("*.partial"))
    # The prompts band and the zero-variance drop leave the solved task out.
    for setting in ("groups.prompts_max_pass_rate=1", "groups.drop_zero_variance=reward"):
        done = export(settings, "--to", str(target), "--quiet", "--set", setting)
        assert done.returncode == 0, done.stderr
        assert pq.read_table(target).to_pylist() == rows[:2], setting
