"""The pipeline benchmark's results: what was measured, summaries, bars, Markdown, chart.

Everything here except :func:`chart` is pure (no I/O), so the arithmetic and the
rendering are unit-tested without a broker.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Final

import msgspec

from bench.runs import BARE, KCAT, RATE_HOW, RAW, WORKER, Latency, Run

#: In the order of a round, and of the table.
SYSTEMS: Final = (KCAT, RAW, BARE, WORKER)
WHAT: Final = {
    KCAT: "kcat reads the topic to a file",
    RAW: "aiokafka getmany: decode, assemble, format, write JSONL, commit",
    BARE: "a Faust agent that only decodes",
    WORKER: "stream-export worker: steps topic to lines in the output file",
}

LATENCY_HOW: Final = (
    "from the producer's send time of the message that completed an episode (its "
    "last distinct event; each event carries its scheduled send time, encoded before "
    "the schedule starts) to the first reading "
    "(every {poll_ms:.0f} ms) in which the worker's output file holds the "
    "episode's line"
)


class Load(msgspec.Struct, kw_only=True):
    events: int
    episodes: int
    partitions: int
    mean_event_bytes: float


class Heading(msgspec.Struct, kw_only=True):
    """What a report of either benchmark starts with (bench.harness.heading)."""

    date: str
    command: str
    machine: str
    broker: str
    rounds: int
    poll_ms: float


class Report(Heading, kw_only=True):
    load: Load
    runs: list[Run] = msgspec.field(default_factory=list)
    latency: Latency | None = None
    notes: list[str] = msgspec.field(default_factory=list)
    #: File name of the chart beside the Markdown, when one was drawn.
    chart: str | None = None


class Spread(msgspec.Struct):
    min: float
    median: float
    max: float


class Bar(msgspec.Struct, kw_only=True):
    """One of issue 12's bars and where this run stands."""

    name: str
    op: str
    target: float
    value: Spread | None

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "not measured"
        v = self.value.median
        ok = v >= self.target if self.op == ">=" else v <= self.target
        return "met" if ok else "missed"

    def to_builtins(self) -> dict[str, object]:
        """The bar as a results file gives it: its target, value and verdict."""
        return {
            "name": self.name,
            "target": f"{self.op} {self.target:g}",
            "value": self.value,
            "verdict": self.verdict,
        }


# -- arithmetic -------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100), interpolating linearly between ranks."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is not within 0-100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def spread(values: Sequence[float]) -> Spread:
    return Spread(min(values), statistics.median(values), max(values))


def summary(runs: Sequence[Run]) -> dict[str, dict[str, Spread]]:
    """System -> measure -> min/median/max over rounds, systems in table order."""
    out: dict[str, dict[str, Spread]] = {}
    for system in SYSTEMS:
        mine = [r for r in runs if r.system == system]
        if mine:
            out[system] = {
                "events_per_s": spread([r.events_per_s for r in mine]),
                "cpu_us_per_event": spread([r.cpu_us_per_event for r in mine]),
                "peak_rss_mb": spread([r.peak_rss_mb for r in mine]),
                "wall_s": spread([r.wall_s for r in mine]),
            }
    return out


def ratios(runs: Sequence[Run], of: str = WORKER) -> dict[str, Spread]:
    """events/s of ``of`` over each other system, per round (rounds where both ran)."""
    rate = {(r.system, r.round): r.events_per_s for r in runs}
    out: dict[str, Spread] = {}
    for other in SYSTEMS:
        if other == of:
            continue
        per_round = [
            rate[of, n] / rate[other, n]
            for (system, n) in rate
            if system == of and (other, n) in rate
        ]
        if per_round:
            out[other] = spread(per_round)
    return out


def bars(report: Report) -> list[Bar]:
    """Issue 12's bars (item 4) against this run: ratios per round, latency p99."""
    r = ratios(report.runs)
    p99 = report.latency.p99_s if report.latency else None
    return [
        Bar(name="worker / bare Faust, events/s", op=">=", target=3.0, value=r.get(BARE)),
        Bar(name="worker / raw pipeline, events/s", op=">=", target=0.15, value=r.get(RAW)),
        Bar(
            name="end-to-end p99 at half load, s",
            op="<=",
            target=1.0,
            value=None if p99 is None else Spread(p99, p99, p99),
        ),
    ]


# -- rendering --------------------------------------------------------------------


def to_json(report: Report) -> bytes:
    """The report with its summary, per-round ratios and bars, as indented JSON."""
    data = {
        **msgspec.to_builtins(report),
        "summary": summary(report.runs),
        "ratios": {f"{WORKER} / {other}": s for other, s in ratios(report.runs).items()},
        "bars": [b.to_builtins() for b in bars(report)],
    }
    return msgspec.json.format(msgspec.json.encode(data)) + b"\n"


def num(value: float) -> str:
    """A figure with the precision it deserves: 3 significant digits, thousands commas."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{digits}f}"


def _cells(s: Spread) -> str:
    return f"{num(s.min)} | {num(s.median)} | {num(s.max)}"


def markdown(report: Report) -> str:
    """The results as Markdown: what ran, the table, the ratios and bars, latency, how."""
    load = report.load
    lines = [
        f"# Pipeline benchmark, {report.date}",
        "",
        f"`{report.command}` on {report.machine}; broker: {report.broker}.",
        f"Load: {load.events:,} events ({load.episodes:,} episodes, mean "
        f"{load.mean_event_bytes:.0f} bytes) over {load.partitions} partitions, produced "
        "once before the rounds to the topic the others read and once per worker run to "
        "a topic of its own (the worker writes control ticks to its steps topic); "
        f"{report.rounds} round(s), each running {', '.join(SYSTEMS)} in turn.",
        "",
        "| system | events/s min | median | max | CPU µs/event min | median | max "
        "| peak RSS MB (median) | start to done s (median) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for system, m in summary(report.runs).items():
        lines.append(
            f"| {system} | {_cells(m['events_per_s'])} | {_cells(m['cpu_us_per_event'])} "
            f"| {num(m['peak_rss_mb'].median)} | {num(m['wall_s'].median)} |"
        )
    lines += ["", "| ratio (per round) | min | median | max |", "| --- | ---: | ---: | ---: |"]
    for other, s in ratios(report.runs).items():
        lines.append(f"| worker / {other} | {_cells(s)} |")
    lines += ["", "| bar (issue 12) | target | this run (median) | verdict |"]
    lines.append("| --- | --- | ---: | --- |")
    for bar in bars(report):
        value = "-" if bar.value is None else num(bar.value.median)
        lines.append(f"| {bar.name} | {bar.op} {num(bar.target)} | {value} | {bar.verdict} |")
    lat = report.latency
    lines.append("")
    if report.chart:
        lines += [f"![events/s and CPU per event]({report.chart})", ""]
    if lat is not None:
        lines += [
            f"End-to-end latency at {num(lat.rate_events_per_s)} events/s (half the "
            f"worker's median rate) over {lat.seconds:.0f} s, {lat.episodes:,} episodes: "
            f"p50 {lat.p50_s:.2f} s, p90 {lat.p90_s:.2f} s, p99 {lat.p99_s:.2f} s, "
            f"max {lat.max_s:.2f} s; measured {LATENCY_HOW.format(poll_ms=report.poll_ms)}.",
            "",
        ]
    lines.append("Systems: " + "; ".join(f"{s}: {WHAT[s]}" for s in SYSTEMS) + ".")
    lines += ["", RATE_HOW.format(poll_ms=report.poll_ms)]
    lines += [f"\nNote: {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def chart(report: Report, path: Path) -> str | None:
    """A PNG bar chart of events/s and CPU per event; a reason when it cannot be drawn."""
    try:
        import matplotlib  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return (
            "matplotlib is not installed, so no chart was drawn "
            "(install it: uv pip install matplotlib, or the project's bench extra)"
        )
    matplotlib.use("Agg")
    from matplotlib import pyplot  # type: ignore[import-not-found, unused-ignore]

    stats = summary(report.runs)
    names = list(stats)
    fig, axes = pyplot.subplots(1, 2, figsize=(11, 4.2))
    for ax, measure, title in (
        (axes[0], "events_per_s", "events/s (higher is better)"),
        (axes[1], "cpu_us_per_event", "CPU µs per event (lower is better)"),
    ):
        s = [stats[n][measure] for n in names]
        medians = [x.median for x in s]
        errors = [[x.median - x.min for x in s], [x.max - x.median for x in s]]
        colors = ["#dd8452" if n == WORKER else "#4c72b0" for n in names]
        ax.bar(names, medians, yerr=errors, capsize=4, color=colors)
        for i, x in enumerate(s):
            ax.annotate(
                num(x.median),
                (i, x.max),
                xytext=(0, 3),
                textcoords="offset points",
                ha="center",
                va="bottom",
                fontsize=8,
            )
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
    lat = report.latency
    where = f", p99 {lat.p99_s:.2f} s at half load" if lat else ""
    fig.suptitle(
        f"{report.load.events:,} events, {report.rounds} round(s), median and min-max; "
        f"{report.date}{where}",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    pyplot.close(fig)
    return None
