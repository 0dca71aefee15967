"""The pipeline benchmark's results (``python -m bench``): its systems, summary,
ratios per round, issue 12's bars, Markdown and JSON (bench.report's), chart.

Everything here except :func:`chart` is pure (no I/O), so the arithmetic and the
rendering are unit-tested without a broker.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Final

import msgspec

from bench.report import (
    Bar,
    Spread,
    bar_table,
    cells,
    num,
    page,
    results_json,
    round_ratios,
    row,
    single,
    spread,
    title,
)
from bench.runs import BARE, KCAT, RATE_HOW, RAW, WORKER, RoundsReport, Run, by_round

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


class Report(RoundsReport[Load], kw_only=True):
    #: File name of the chart beside the Markdown, when one was drawn.
    chart: str | None = None


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


def ratios(runs: Sequence[Run]) -> dict[str, Spread]:
    """events/s of the worker over each other system's, per round (rounds where both ran)."""
    return round_ratios(by_round(runs), WORKER, SYSTEMS)


def bars(report: Report) -> list[Bar]:
    """Issue 12's bars (item 4) against this run: ratios per round, latency p99;
    each with its stretch target."""
    bare, raw = (ratios(report.runs).get(f"{WORKER} / {other}") for other in (BARE, RAW))
    p99 = single(report.latency.p99_s if report.latency else None)
    return [
        Bar(name="worker / bare Faust, events/s", op=">=", target=3, stretch=6, value=bare),
        Bar(name="worker / raw pipeline, events/s", op=">=", target=0.15, stretch=0.3, value=raw),
        Bar(name="end-to-end p99 at half load, s", op="<=", target=1, stretch=0.3, value=p99),
    ]


def to_json(report: Report) -> bytes:
    """The report with its summary, per-round ratios and bars, as indented JSON."""
    return results_json(
        report, bars(report), summary=summary(report.runs), ratios=ratios(report.runs)
    )


def markdown(report: Report) -> str:
    """The results as Markdown: what ran, the table, the ratios and bars, latency, how."""
    load = report.load
    lines = [
        *title("Pipeline benchmark", report),
        f"Load: {load.events:,} events ({load.episodes:,} episodes, mean "
        f"{load.mean_event_bytes:.0f} bytes) over {load.partitions} partitions, produced "
        "once before the rounds to the topic the others read and once per worker run to "
        "a topic of its own (the worker writes control ticks to its steps topic); "
        f"{report.rounds} round(s), each running {', '.join(SYSTEMS)} in turn.",
        "",
        row(
            "system",
            "events/s min / median / max",
            "CPU µs/event min / median / max",
            "peak RSS MB (median)",
            "start to done s (median)",
        ),
        row("---", "---", "---", "---:", "---:"),
    ]
    for system, m in summary(report.runs).items():
        lines.append(
            row(
                system,
                cells(m["events_per_s"]),
                cells(m["cpu_us_per_event"]),
                num(m["peak_rss_mb"].median),
                num(m["wall_s"].median),
            )
        )
    lines += ["", row("ratio (per round)", "min / median / max"), row("---", "---")]
    lines += [row(name, cells(s)) for name, s in ratios(report.runs).items()]
    lines += ["", *bar_table(12, bars(report)), ""]
    lat = report.latency
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
    return page(lines, report.notes)


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
    for ax, measure, caption in (
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
        ax.set_title(caption, fontsize=10)
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
