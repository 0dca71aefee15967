"""bench.learn_loop's parsing and aggregation of the trainer's and TRL's log lines."""

from __future__ import annotations

import pytest

from bench.learn_loop import (
    Outcome,
    bars,
    idle_fraction,
    json_lines,
    per_step,
    reached_at,
    rollouts_trained,
    system_spreads,
    trainer_seconds,
)

TRAINER_LOG = """trainer: left out r1: no sampled token
{"waited_s": 3.0, "loss": 0.1, "step_s": 0.5, "fence_s": 0.5, "version": 1}
{"waited_s": 1.0, "version": 1, "groups": 4, "fresh": 0}
{"waited_s": 0.0, "loss": 0.2, "step_s": 0.3, "fence_s": 0.7, "version": 2}
{"waited_s": 1.0, "broken
"""


def test_the_trainer_lines_are_its_json_lines_with_the_key() -> None:
    lines = json_lines(TRAINER_LOG, "waited_s")
    assert [line["waited_s"] for line in lines] == [3.0, 1.0, 0.0]


def test_idle_is_the_wait_over_all_the_trainer_s_seconds() -> None:
    lines = json_lines(TRAINER_LOG, "waited_s")
    assert trainer_seconds(lines) == (4.0, 6.0)
    assert idle_fraction(lines) == pytest.approx(4 / 6)
    assert idle_fraction([]) == 0.0
    assert per_step(lines) == {"waited_s": 1.5, "step_s": 0.4, "fence_s": 0.6}


def test_rollouts_count_only_the_steps_taken() -> None:
    ledger = [
        {"version": 1, "stepped": True, "rollouts": [[0, 1.0]] * 32},
        {"version": 1, "stepped": False, "rollouts": [[0, 0.0]] * 8},
        {"version": 2, "stepped": True, "rollouts": [[1, 1.0]] * 30},
    ]
    assert rollouts_trained(ledger) == 62


def test_trl_reaches_the_target_at_its_first_step_there() -> None:
    lines = [{"step": 1, "reward": 0.1}, {"step": 2, "reward": 0.8}, {"step": 3, "reward": 0.9}]
    assert reached_at(lines, 0.8) == {"step": 2, "reward": 0.8}
    assert reached_at(lines, 0.95) is None


def test_the_bars_take_the_ratio_per_round_and_leave_out_rounds_short_of_the_target() -> None:
    outcomes = [
        Outcome(system="loop", round=1, reached=True, wall_s=30.0, steps=10, idle=0.2),
        Outcome(system="trl", round=1, reached=True, wall_s=10.0, steps=8),
        Outcome(system="loop", round=2, reached=True, wall_s=20.0, steps=9, idle=0.05),
        Outcome(system="trl", round=2, reached=True, wall_s=20.0, steps=7),
        Outcome(system="loop", round=3, reached=False, wall_s=99.0, steps=40, idle=0.9),
        Outcome(system="trl", round=3, reached=True, wall_s=10.0, steps=8),
    ]
    ratio, idle = bars(outcomes)
    assert ratio.value is not None and (ratio.value.min, ratio.value.max) == (1.0, 3.0)
    assert ratio.value.median == 2.0 and ratio.verdict == "missed"  # bar: <= 1.5
    assert idle.value is not None and idle.value.median == pytest.approx(0.125)
    assert system_spreads(outcomes, "steps")["trl"].median == 8
