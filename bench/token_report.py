"""The token-plane benchmark's results: tokens/s and MB/s per system, the ratios per
round, issue 26's bars, Markdown and JSON (pure, no I/O).

A run measures messages/s (``pipeline_report.Run.events_per_s``, over the same readings as
the pipeline benchmark); every system reads the same load, so its tokens/s and
MB/s are that rate times the load's tokens and bytes per message, and a ratio of
MB/s is a ratio of tokens/s.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Final

import msgspec

from bench.pipeline_report import Bar, Heading, Spread, num, ratios, spread
from bench.runs import KCAT, RATE_HOW, RAW, WORKER, Latency, Run

SYSTEMS: Final = (KCAT, RAW, WORKER)
WHAT: Final = {
    KCAT: "kcat reads the topic to a file",
    RAW: "bench/raw_tokens.py, written without the project's code: aiokafka getmany, "
    "decode the calls, rebuild the sequences, append the tokens rows, commit; no durability",
    WORKER: "stream-export worker, format.format=tokens: steps topic to tokens rows in its files",
}
MB: Final = 1e6


class TokenLoadFigures(msgspec.Struct, kw_only=True):
    episodes: int
    messages: int
    calls: int
    deltas: int
    rows: int
    #: in the rows' input_ids
    tokens: int
    bytes: int
    partitions: int


class OpenEpisodes(msgspec.Struct, kw_only=True):
    """``bench.open_episodes`` with token episodes: a start and a few calls each."""

    episodes: int
    calls: int
    mb: float
    take_in_s: float
    peak_rss_mb: float
    restart_peak_rss_mb: float
    consume_again_s: float
    rebuild_s: float


class TokenReport(Heading, kw_only=True):
    load: TokenLoadFigures
    runs: list[Run] = msgspec.field(default_factory=list)
    latency: Latency | None = None
    open_episodes: OpenEpisodes | None = None
    notes: list[str] = msgspec.field(default_factory=list)


def rates(load: TokenLoadFigures, run: Run) -> tuple[float, float]:
    """(tokens/s, MB/s) of a run on ``load``."""
    per_message = run.events_per_s / load.messages
    return per_message * load.tokens, per_message * load.bytes / MB


def summary(report: TokenReport) -> dict[str, dict[str, Spread]]:
    """System -> tokens/s, MB/s, CPU µs per MB, peak RSS: min/median/max over rounds."""
    out: dict[str, dict[str, Spread]] = {}
    per_mb = report.load.messages / (report.load.bytes / MB)
    for system in SYSTEMS:
        mine = [r for r in report.runs if r.system == system]
        if mine:
            figures = [rates(report.load, r) for r in mine]
            out[system] = {
                "tokens_per_s": spread([t for t, _ in figures]),
                "mb_per_s": spread([m for _, m in figures]),
                "cpu_ms_per_mb": spread([r.cpu_us_per_event * per_mb / 1000 for r in mine]),
                "peak_rss_mb": spread([r.peak_rss_mb for r in mine]),
            }
    return out


def _single(value: float | None) -> Spread | None:
    return None if value is None else Spread(value, value, value)


def bars(report: TokenReport) -> list[tuple[Bar, float | None]]:
    """Issue 26's bars (item 5), each with its stretch target if it has one."""
    r = ratios(report.runs)
    lat, opened = report.latency, report.open_episodes
    return [
        (Bar(name="worker / raw pipeline, MB/s", op=">=", target=0.3, value=r.get(RAW)), 0.5),
        (
            Bar(
                name="end-to-end p99 at half load, s",
                op="<=",
                target=1.0,
                value=_single(lat.p99_s if lat else None),
            ),
            None,
        ),
        (
            Bar(
                name=f"peak RSS, {opened.episodes if opened else 10_000:,} open token episodes, MB",
                op="<=",
                target=1024.0,
                value=_single(
                    max(opened.peak_rss_mb, opened.restart_peak_rss_mb) if opened else None
                ),
            ),
            None,
        ),
    ]


def to_json(report: TokenReport) -> bytes:
    data = {
        **msgspec.to_builtins(report),
        "summary": summary(report),
        "ratios": {f"{WORKER} / {other}": s for other, s in ratios(report.runs).items()},
        "bars": [
            {
                "name": b.name,
                "target": f"{b.op} {b.target:g}",
                "stretch": stretch,
                "value": b.value,
                "verdict": b.verdict,
            }
            for b, stretch in bars(report)
        ],
    }
    return msgspec.json.format(msgspec.json.encode(data)) + b"\n"


def _cells(s: Spread) -> str:
    return f"{num(s.min)} / {num(s.median)} / {num(s.max)}"


def _verdict(bar: Bar, stretch: float | None) -> str:
    verdict = bar.verdict
    if verdict == "met" and stretch is not None and bar.value is not None:
        verdict += " (and the stretch)" if bar.value.median >= stretch else " (stretch not)"
    return verdict


def markdown(report: TokenReport) -> str:
    load = report.load
    lines = [
        f"# Token-plane benchmark, {report.date}",
        "",
        f"`{report.command}` on {report.machine}; broker: {report.broker}.",
        f"Load: {load.episodes:,} llm_call episodes, {load.messages:,} messages "
        f"({load.bytes / MB:,.1f} MB, mean {load.bytes / load.messages / 1000:.1f} kB), "
        f"{load.calls:,} calls of which {load.deltas:,} sent as deltas, over "
        f"{load.partitions} partitions; the output is {load.rows:,} tokens rows holding "
        f"{load.tokens:,} tokens. Produced once before the rounds to the topic kcat and "
        "the raw pipeline read and once per worker run to a topic of its own; "
        f"{report.rounds} round(s), each running {', '.join(SYSTEMS)} in turn.",
        "",
        "| system | tokens/s min / median / max | MB/s min / median / max "
        "| CPU ms per MB (median) | peak RSS MB (median) |",
        "| --- | --- | --- | ---: | ---: |",
    ]
    for system, m in summary(report).items():
        lines.append(
            f"| {system} | {_cells(m['tokens_per_s'])} | {_cells(m['mb_per_s'])} "
            f"| {num(m['cpu_ms_per_mb'].median)} | {num(m['peak_rss_mb'].median)} |"
        )
    per_round = {(r.system, r.round): r.events_per_s for r in report.runs}
    lines += ["", "| round | worker / raw pipeline | worker / kcat |", "| --- | ---: | ---: |"]
    for n in range(1, report.rounds + 1):
        worker = per_round.get((WORKER, n))
        cells = [
            "-" if worker is None or (s, n) not in per_round else num(worker / per_round[s, n])
            for s in (RAW, KCAT)
        ]
        lines.append(f"| {n} | {' | '.join(cells)} |")
    lines += ["", "| bar (issue 26) | target | this run (min / median / max) | verdict |"]
    lines.append("| --- | --- | --- | --- |")
    for bar, stretch in bars(report):
        target = f"{bar.op} {num(bar.target)}" + (f" ({num(stretch)})" if stretch else "")
        value = "-" if bar.value is None else _cells(bar.value)
        lines.append(f"| {bar.name} | {target} | {value} | {_verdict(bar, stretch)} |")
    lines.append("")
    lat = report.latency
    if lat is not None:
        rates = worker_rates(report.runs)
        share = (
            f" ({lat.rate_events_per_s / statistics.median(rates):.2f} of the worker's median rate)"
            if rates
            else ""
        )
        lines += [
            f"End-to-end latency at {num(lat.rate_events_per_s)} messages/s{share}, "
            f"{lat.seconds:.0f} s from preparing the messages to the last sent, "
            f"{lat.episodes:,} episodes: "
            f"p50 {lat.p50_s:.2f} s, p90 {lat.p90_s:.2f} s, p99 {lat.p99_s:.2f} s, "
            f"max {lat.max_s:.2f} s, from the send of an episode's last message to its "
            "first row in the worker's files.",
            "",
        ]
    opened = report.open_episodes
    if opened is not None:
        lines += [
            f"Open token episodes (`python -m bench.open_episodes --token-calls "
            f"{opened.calls}`): {opened.episodes:,} episodes of a start and "
            f"{opened.calls} calls each ({opened.mb:,.0f} MB), none ended, on RocksDB: taken in "
            f"in {opened.take_in_s:.1f} s at a peak RSS of {num(opened.peak_rss_mb)} MB; "
            f"after a kill -9, consuming again in {opened.consume_again_s:.1f} s (rebuild "
            f"{opened.rebuild_s:.1f} s) at a peak RSS of {num(opened.restart_peak_rss_mb)} MB.",
            "",
        ]
    lines.append("Systems: " + "; ".join(f"{s}: {WHAT[s]}" for s in SYSTEMS) + ".")
    lines += [
        "",
        "tokens/s and MB/s: the messages/s measured as the pipeline benchmark measures "
        "events/s (below) times the load's tokens (of the rows) and bytes (of the "
        "messages) per message. " + RATE_HOW.format(poll_ms=report.poll_ms),
    ]
    lines += [f"\nNote: {note}" for note in report.notes]
    return "\n".join(lines) + "\n"


def worker_rates(runs: Sequence[Run]) -> list[float]:
    return [r.events_per_s for r in runs if r.system == WORKER]
