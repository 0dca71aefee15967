"""The live loop's pure parts: the task (prompt sets, reward functions by import path,
the toy digit reward) and the trainer's ledger (what each version trained, the
learning curve, a torn last line after a crash)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_export.errors import TrainerInputError
from stream_export.learn.ledger import Ledger, reward_curve
from stream_export.learn.tasks import (
    DEFAULT_REWARD,
    Episode,
    digit_reward,
    load_reward,
    prompts,
    read_prompts,
)


def episode(tokens: list[str]) -> Episode:
    return Episode({"prompt": "p"}, [], "".join(tokens), tokens)


def test_the_digit_reward_looks_at_the_first_four_tokens_only() -> None:
    assert digit_reward(episode(["a", " b", " 7", "c"])) == 1.0
    assert digit_reward(episode(["a", "7", "b"])) == 1.0
    assert digit_reward(episode(["a", "b", "c", "d", "7"])) == 0.0
    assert digit_reward(episode(["a7", "b"])) == 0.0  # a token that only holds a digit
    assert digit_reward(episode([])) == 0.0


def test_a_reward_function_is_found_by_its_import_path() -> None:
    assert load_reward(DEFAULT_REWARD) is digit_reward
    loads: Any = load_reward("json:loads")
    assert loads('{"a": 1}') == {"a": 1}
    for bad in ("json", "json:", ":dumps", "no_such_module_x:f", "json:no_such", "json:__doc__"):
        with pytest.raises(TrainerInputError):
            load_reward(bad)


def test_a_prompt_set_reads_json_lines_and_text_lines(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"prompt": "add 2 and 3", "answer": 5}\n\nplain text prompt\n')
    assert read_prompts(path) == [
        {"prompt": "add 2 and 3", "answer": 5},
        {"prompt": "plain text prompt"},
    ]
    drawn = list(itertools.islice(prompts(path, seed=1), 6))
    # every pass holds each task once
    assert sorted(map(str, drawn[:2])) == sorted(map(str, read_prompts(path)))
    assert sorted(map(str, drawn[2:4])) == sorted(map(str, read_prompts(path)))
    for bad in ('{"prompt": 3}\n', "{not json\n", "\n\n", '{"answer": 1}\n'):
        path.write_text(bad)
        with pytest.raises(TrainerInputError):
            read_prompts(path)


def test_the_default_task_is_fresh_every_time() -> None:
    drawn = [t["prompt"] for t in itertools.islice(prompts(None, seed=3), 200)]
    assert len(set(drawn)) == len(drawn)
    assert all(len(p.split()) == 5 for p in drawn)


def test_the_ledger_survives_a_torn_line_and_says_what_was_trained(tmp_path: Path) -> None:
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    assert ledger.version == 0 and not ledger.trained
    ledger.append({"version": 1, "records": ["a", "b"], "rollouts": [[0, 0.0], [0, 1.0]]})
    ledger.append({"version": 2, "records": ["c"], "rollouts": [[1, 1.0], [0, 0.0]]})
    with (tmp_path / "ledger.jsonl").open("a") as out:
        out.write('{"version": 3, "records": ["d"')  # a kill -9 mid-line
    again = Ledger.open(tmp_path / "ledger.jsonl")
    assert again.version == 2 and again.trained == {"a", "b", "c"}
    assert again.curve() == {0: (1 / 3, 3), 1: (1.0, 1)}


def test_the_target_counts_a_batch_not_yet_in_the_ledger(tmp_path: Path) -> None:
    # the trainer asks before stepping on a batch: when its rollouts take a version to
    # the target, it records the batch unstepped and ends, the version that reached it
    # still serving
    ledger = Ledger.open(tmp_path / "ledger.jsonl")
    ledger.append({"version": 1, "records": ["a"], "rollouts": [[0, 0.0]] * 4 + [[1, 1.0]] * 2})
    assert not ledger.reached(0.8, 4)  # version 1: two rollouts, not a window's worth
    assert ledger.reached(0.8, 4, [[1, 1.0], [1, 0.5]])  # 3.5 / 4
    assert not ledger.reached(0.9, 4, [[1, 1.0], [1, 0.5]])
    assert not ledger.reached(0.8, 4, [[2, 1.0]] * 3)  # another version's
    assert ledger.reached(0.0, 4)  # version 0's four


@given(st.lists(st.tuples(st.integers(-1, 5), st.sampled_from([0.0, 0.5, 1.0]))))
def test_the_curve_is_the_mean_reward_by_serving_version(pairs: list[tuple[int, float]]) -> None:
    curve = reward_curve(pairs)
    assert list(curve) == sorted({v for v, _ in pairs})
    for version, (mean, count) in curve.items():
        rewards = [r for v, r in pairs if v == version]
        assert count == len(rewards) and mean == pytest.approx(sum(rewards) / len(rewards))
