"""The pipeline benchmark's pure parts (no broker): arithmetic, padding, rendering, CLI."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import msgspec
import pytest

from bench import BenchError
from bench.load import mean_size, pad
from bench.pipeline_report import (
    Load,
    Report,
    bars,
    markdown,
    ratios,
    summary,
    to_json,
)
from bench.progress import Progress
from bench.raw_pipeline import DictStore
from bench.report import Spread
from bench.runs import BARE, KCAT, RAW, WORKER, Latency, Run, window_rate
from bench.systems import cpu_seconds, peak_rss_mb, stat_cpu
from stream_export.assemble.episode import build_episode
from stream_export.assemble.state import PartitionState, receive
from stream_export.assemble.verdicts import LATE, Rejected, Verdict
from stream_export.contract.decoding import decode_event
from stream_export.settings.assemble import AssembleSettings
from tests.support.traffic import disorder

ROOT = Path(__file__).resolve().parents[1]


def test_window_rate_counts_only_the_share_between_the_readings() -> None:
    # 80% of 1000 events in 2 s, 1.6 CPU s for them.
    rate, cpu = window_rate((10.0, 0.1, 1.0), (12.0, 0.9, 2.6), 1000)
    assert rate == pytest.approx(400)
    assert cpu == pytest.approx(2000)
    with pytest.raises(BenchError, match="within one reading"):
        window_rate((10.0, 1.0, 1.0), (10.0, 1.0, 1.0), 1000)


def _run(system: str, round_: int, rate: float, cpu: float = 10.0) -> Run:
    return Run(
        system=system,
        round=round_,
        events_per_s=rate,
        cpu_us_per_event=cpu,
        peak_rss_mb=100.0 + round_,
        wall_s=5.0,
    )


RUNS = [
    _run(KCAT, 1, 200_000, 8),
    _run(RAW, 1, 100_000, 9),
    _run(BARE, 1, 5_000, 200),
    _run(WORKER, 1, 10_000, 100),
    _run(KCAT, 2, 220_000, 7),
    _run(RAW, 2, 50_000, 11),
    _run(BARE, 2, 2_000, 300),
    _run(WORKER, 2, 8_000, 150),
    _run(WORKER, 3, 9_000, 120),  # a round in which the others failed
]


def test_ratios_are_taken_per_round() -> None:
    r = ratios(RUNS)
    assert r["worker / bare Faust"] == Spread(2.0, 3.0, 4.0)
    raw = r["worker / raw pipeline"]
    assert (raw.min, raw.max) == (0.1, 0.16)
    assert raw.median == pytest.approx(0.13)
    assert list(r) == [f"worker / {other}" for other in (KCAT, RAW, BARE)]
    s = summary(RUNS)
    assert list(s) == [KCAT, RAW, BARE, WORKER]
    assert s[WORKER]["events_per_s"] == Spread(8_000, 9_000, 10_000)
    assert s[BARE]["cpu_us_per_event"] == Spread(200, 250, 300)


def _report(latency: Latency | None) -> Report:
    return Report(
        date="2026-12-03 09:00 UTC",
        command="python -m bench --rounds 2",
        machine="2 cores",
        broker="given, 127.0.0.1:9092",
        load=Load(events=180_000, episodes=26_000, partitions=4, mean_event_bytes=313.2),
        rounds=2,
        poll_ms=20,
        runs=RUNS,
        latency=latency,
        notes=["round 3, kcat: it failed"],
        chart="x.png",
    )


LATENCY = Latency(
    rate_events_per_s=4_500, episodes=600, seconds=30, p50_s=0.3, p90_s=0.5, p99_s=1.25, max_s=2
)


def test_bars_say_met_missed_or_not_measured() -> None:
    verdicts = {b.name: b.verdict for b in bars(_report(LATENCY))}
    assert verdicts == {
        "worker / bare Faust, events/s": "met",  # median 3.0 >= 3
        "worker / raw pipeline, events/s": "missed",  # median 0.13 < 0.15
        "end-to-end p99 at half load, s": "missed",  # 1.25 > 1.0
    }
    assert bars(_report(None))[2].verdict == "not measured"


def test_markdown_holds_the_table_ratios_bars_latency_and_notes() -> None:
    text = markdown(_report(LATENCY))
    lines = text.splitlines()
    assert lines[0] == "# Pipeline benchmark, 2026-12-03 09:00 UTC"
    assert "`python -m bench --rounds 2` on 2 cores" in text
    assert "Load: 180,000 events (26,000 episodes, mean 313 bytes) over 4 partitions" in text
    assert "| worker | 8,000 / 9,000 / 10,000 | 100 / 120 / 150 | 102 | 5.00 |" in lines
    assert "| kcat | 200,000 / 210,000 / 220,000 | 7.00 / 7.50 / 8.00 | 102 | 5.00 |" in lines
    assert "| worker / bare Faust | 2.00 / 3.00 / 4.00 |" in lines
    bars = [line for line in lines if line.startswith("| worker / ") and "events/s |" in line]
    assert bars == [
        "| worker / bare Faust, events/s | >= 3.00 (6.00) | 2.00 / 3.00 / 4.00 "
        "| met (stretch not) |",
        "| worker / raw pipeline, events/s | >= 0.150 (0.300) | 0.100 / 0.130 / 0.160 | missed |",
    ]
    assert (
        "| end-to-end p99 at half load, s | <= 1.00 (0.300) | 1.25 / 1.25 / 1.25 | missed |"
        in lines
    )
    assert "p50 0.30 s, p90 0.50 s, p99 1.25 s, max 2.00 s" in text
    assert "![events/s and CPU per event](x.png)" in lines
    assert "Note: round 3, kcat: it failed" in text
    without = markdown(_report(None))
    assert "| end-to-end p99 at half load, s | <= 1.00 (0.300) | - | not measured |" in without
    assert "p99" not in without.split("| bar")[0]


def test_json_holds_the_report_and_what_is_derived_from_it() -> None:
    data = to_json(_report(LATENCY))
    assert msgspec.json.decode(data, type=Report) == _report(LATENCY)  # extra keys ignored
    derived = msgspec.json.decode(data)
    assert derived["summary"]["worker"]["events_per_s"] == {
        "min": 8000.0,
        "median": 9000.0,
        "max": 10000.0,
    }
    assert derived["ratios"]["worker / bare Faust"]["median"] == 3.0
    assert [(b["target"], b["stretch"], b["verdict"]) for b in derived["bars"]] == [
        (">= 3", 6, "met"),
        (">= 0.15", 0.3, "missed"),
        ("<= 1", 0.3, "missed"),
    ]


def test_padding_keeps_every_verdict_of_the_plan() -> None:
    """The padded load drives the pure assembler (as the raw pipeline does, in
    batches persisted to its dict store) to exactly the planned verdicts."""
    plan = disorder(300, seed=3, unended=0.0, window=20)
    padded = pad(plan, 313)
    assert len(padded.messages) == len(plan.messages)
    sizes = [len(value) for _, value in padded.messages]
    # A time stamp near 1.8e9 is 12 to 18 characters (1 to 7 decimals), so a message
    # differs from the reference time's size by at most 6 bytes either way.
    assert min(sizes) >= 313 - 6 and max(sizes) <= 313 + 6
    assert mean_size(padded) == pytest.approx(313, abs=1)
    assert all(decode_event(v).episode_id.encode() == k for k, v in padded.messages)

    store = DictStore()
    state = PartitionState(0, AssembleSettings(), store)
    verdicts: Counter[str] = Counter()
    built = 0
    for start in range(0, len(padded.messages), 50):
        for offset, (key, value) in enumerate(padded.messages[start : start + 50], start):
            result = receive(state, key, value, offset, time.time()).result
            if isinstance(result, Rejected):
                assert result.reason == LATE, result
                verdicts["late"] += 1
            elif result is Verdict.ACCEPTED:
                verdicts["accepted"] += 1
            else:
                assert result is Verdict.DUPLICATE
                verdicts["duplicate"] += 1
        finished = state.take_finished()
        built += sum(build_episode(0, item) is not None for item in finished)
        store.persist(state, finished, 3600.0)
    assert verdicts == plan.verdicts
    assert built == len(plan.ended)
    assert not store.chunks  # every episode closed: its chunks were deleted
    assert len(store.markers) == len(plan.ended)


def test_stat_cpu_reads_a_command_name_with_spaces_and_parentheses() -> None:
    tick = os.sysconf("SC_CLK_TCK")
    line = f"42 (a) b (c)) S 1 42 42 0 -1 4194560 10 0 0 0 {3 * tick} {tick} {2 * tick} 0 20 0"
    assert stat_cpu(line) == (4.0, 2.0)
    assert cpu_seconds(os.getpid()) > 0
    assert peak_rss_mb(os.getpid()) > 1


def test_progress_prints_a_line_per_step_when_not_a_terminal() -> None:
    out = io.StringIO()
    bar = Progress(2, stream=out)
    bar.step("producing")
    bar.show(0.5)
    bar.step("round 1/1: kcat")
    bar.note("kcat is not installed")
    bar.close()
    assert out.getvalue().splitlines() == [
        "[1/2] producing",
        "[2/2] round 1/1: kcat",
        "kcat is not installed",
    ]


@pytest.mark.parametrize(
    ("module", "flags"),
    [
        ("bench", ("--events", "--event-bytes")),
        ("bench.tokens", ("--episodes", "--open-episodes", "--raw-fetch-bytes")),
    ],
)
def test_help_runs_without_a_broker(module: str, flags: tuple[str, ...]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m {module} ")
    for flag in ("--quick", "--bootstrap", "--rounds", "--latency-seconds", *flags):
        assert flag in out.stdout


def test_a_child_process_gets_the_very_settings_back() -> None:
    """What a benchmark hands its child processes (``--set`` flags) loads back as the
    same settings, list settings included (the bare Faust child once refused one)."""
    from bench.bench_assemble import _settings, child_args
    from stream_export.settings import load

    settings = _settings("127.0.0.1:9092", "t")
    assert load(env={}, overrides=child_args(settings)) == settings
