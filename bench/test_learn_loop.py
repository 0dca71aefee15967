"""bench.learn_loop's parsing and aggregation of the trainer's and TRL's log lines."""

from __future__ import annotations

import os
from pathlib import Path

import msgspec
import pytest

from bench.learn_loop import (
    Outcome,
    bars,
    cpu_seconds,
    group_phases,
    idle_fraction,
    json_lines,
    per_step,
    process_cpu,
    reached_at,
    rollouts_trained,
    steady,
    steps_to,
    system_spreads,
    trainer_seconds,
)
from stream_export.contract.episode import Episode
from tests.support.group_records import record, rollout

TRAINER_LOG = """trainer: left out r1: no sampled token
{"waited_s": 3.0, "loss": 0.1, "step_s": 0.5, "fence_s": 0.5, "ack_s": 0.2, "version": 1}
{"waited_s": 1.0, "ack_s": 0.1, "version": 1, "groups": 4, "fresh": 0}
{"waited_s": 0.0, "loss": 0.2, "step_s": 0.3, "fence_s": 0.7, "ack_s": 0.0, "version": 2}
{"waited_s": 1.0, "broken
"""


def test_the_trainer_lines_are_its_json_lines_with_the_key() -> None:
    lines = json_lines(TRAINER_LOG, "waited_s")
    assert [line["waited_s"] for line in lines] == [3.0, 1.0, 0.0]


def test_idle_is_the_wait_over_all_the_trainer_s_seconds() -> None:
    lines = json_lines(TRAINER_LOG, "waited_s")
    assert trainer_seconds(lines) == pytest.approx((4.0, 6.3))
    assert idle_fraction(lines) == pytest.approx(4 / 6.3)
    assert idle_fraction([]) == 0.0
    assert per_step(lines) == pytest.approx(
        {"waited_s": 1.5, "step_s": 0.4, "fence_s": 0.6, "ack_s": 0.1}
    )


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
        Outcome(system="fed", round=1, reached=True, wall_s=9.0, steps=10, idle=0.02),
        Outcome(system="fed", round=2, reached=True, wall_s=9.0, steps=10, idle=0.04),
    ]
    ratio, idle = bars(outcomes)
    assert ratio.value is not None and (ratio.value.min, ratio.value.max) == (1.0, 3.0)
    assert ratio.value.median == 2.0 and ratio.verdict == "missed"  # bar: <= 1.5
    # the idle bar is the trainer's on a feed already full (generation not the bottleneck)
    assert idle.value is not None and idle.value.median == pytest.approx(0.03)
    assert idle.verdict == "met"
    assert system_spreads(outcomes, "idle")["loop"].median == pytest.approx(0.125)
    assert system_spreads(outcomes, "steps")["trl"].median == 8


def test_the_fed_trainer_s_idle_leaves_out_its_first_batch() -> None:
    lines = json_lines(TRAINER_LOG, "waited_s")
    assert steady(lines) == lines[1:]
    assert idle_fraction(steady(lines)) == pytest.approx(1 / 2.1)


def test_a_restarted_trainer_s_cpu_adds_each_process_s_last_line() -> None:
    lines = [{"cpu_s": 5.0}, {"cpu_s": 6.0}, {"cpu_s": 4.5}, {"cpu_s": 7.0}]
    assert process_cpu(lines) == 13.0
    assert process_cpu([]) == 0.0


def test_a_group_s_phases_run_from_its_rollouts_to_its_close() -> None:
    def timed(start: float, end: float) -> Episode:
        return msgspec.structs.replace(rollout("e", 1.0), start_time=start, end_time=end)

    groups = [
        msgspec.structs.replace(record([timed(10.0, 12.0), timed(11.0, 13.0)], 2), closed_at=13.5),
        msgspec.structs.replace(record([timed(20.0, 26.0), timed(20.0, 21.0)], 2), closed_at=26.1),
        msgspec.structs.replace(record([timed(1.0, 2.0)], 2), rollouts=[]),
    ]
    phases = group_phases(groups)
    assert phases["generate_s"] == pytest.approx(4.5)  # median of 3 and 6
    assert phases["close_s"] == pytest.approx(0.3)  # median of 0.5 and 0.1
    assert group_phases([]) == {}


def test_cpu_seconds_add_a_process_and_its_descendants(tmp_path: Path) -> None:
    tick = os.sysconf("SC_CLK_TCK")

    def proc(pid: int, ppid: int, ticks: int) -> None:
        (tmp_path / str(pid)).mkdir()
        fields = ["S", str(ppid), *["0"] * 9, str(ticks), str(ticks)]
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (py thon) {' '.join(fields)}\n")

    proc(10, 1, tick)  # 2 s
    proc(11, 10, tick * 2)  # 4 s, a child
    proc(12, 11, tick)  # 2 s, a grandchild
    proc(13, 1, tick * 5)  # not in the tree
    (tmp_path / "self").mkdir()
    assert cpu_seconds(10, tmp_path) == pytest.approx(8.0)
    assert cpu_seconds(99, tmp_path) == 0.0


def test_steps_count_to_the_first_version_that_reached_the_target_as_trl_counts() -> None:
    ledger = [
        {"version": 1, "stepped": True, "rollouts": [[0, 0.0]] * 32},
        {"version": 2, "stepped": True, "rollouts": [[1, 0.5]] * 32},
        {"version": 3, "stepped": True, "rollouts": [[2, 0.9]] * 16 + [[1, 0.5]] * 16},
        {"version": 3, "stepped": False, "rollouts": [[2, 0.9]] * 16 + [[3, 1.0]] * 8},
    ]
    # version 2 served 32 rollouts at 0.9: 2 updates before it, 1 on its batch
    assert steps_to(ledger, 0.8, 32) == 3
    assert steps_to(ledger, 0.95, 32) == 3  # none reached: the last version
    assert steps_to(ledger[:1], 0.8, 32) == 1
