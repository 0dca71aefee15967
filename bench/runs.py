"""What one run of a system in a round measured, and the end-to-end latency: the
records of the benchmarks that run systems in alternating rounds (the pipeline's
and the token plane's, bench.harness), and the arithmetic of a run's window.

Pure: the systems are run and read in bench.systems and bench.latency.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Generic, TypeVar

import msgspec

from bench import BenchError
from bench.report import RoundsHeading

L = TypeVar("L")

KCAT: Final = "kcat"
RAW: Final = "raw pipeline"
BARE: Final = "bare Faust"
WORKER: Final = "worker"

RATE_HOW: Final = (
    "events/s: events in the topic times the share of the expected output that "
    "appeared between the first reading showing output and the reading showing "
    "all of it, divided by the time between those readings (readings every "
    "{poll_ms:.0f} ms; start-up excluded). Output is lines in the file (kcat, raw "
    "pipeline), records in the worker's files read with stream_export.output.follow, and "
    "events decoded (bare Faust). CPU per event: utime+stime of the process and "
    "its children (/proc/<pid>/stat) over the same readings. Peak RSS: VmHWM "
    "(/proc/<pid>/status) when done."
)


class Run(msgspec.Struct, kw_only=True):
    """One system's measurement in one round."""

    system: str
    round: int
    events_per_s: float
    cpu_us_per_event: float
    peak_rss_mb: float
    #: Process start to done, start-up included.
    wall_s: float


class Latency(msgspec.Struct, kw_only=True):
    rate_events_per_s: float
    episodes: int
    seconds: float
    p50_s: float
    p90_s: float
    p99_s: float
    max_s: float


class RoundsReport(RoundsHeading, Generic[L], kw_only=True):
    """What a benchmark run in rounds by bench.harness measured: on its load (``L``),
    each system's runs, the latency, and what went wrong (notes)."""

    load: L
    runs: list[Run] = msgspec.field(default_factory=list)
    latency: Latency | None = None
    notes: list[str] = msgspec.field(default_factory=list)


def window_rate(
    first: tuple[float, float, float], last: tuple[float, float, float], events: int
) -> tuple[float, float]:
    """(events/s, CPU µs per event) between two readings of (time, share done, CPU s)."""
    (t0, f0, cpu0), (t1, f1, cpu1) = first, last
    handled = events * (f1 - f0)
    if t1 <= t0 or handled <= 0:
        raise BenchError(
            "the run finished within one reading: too little load to measure (raise --events)"
        )
    return handled / (t1 - t0), (cpu1 - cpu0) / handled * 1e6


def by_round(runs: Sequence[Run]) -> dict[tuple[str, int], float]:
    """(system, round) -> events/s (messages/s) of each run."""
    return {(r.system, r.round): r.events_per_s for r in runs}
