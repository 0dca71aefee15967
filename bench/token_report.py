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

from bench.report import (
    Bar,
    Spread,
    bar_table,
    cells,
    num,
    page,
    per_round,
    results_json,
    round_ratios,
    row,
    single,
    spread,
    title,
)
from bench.runs import KCAT, RATE_HOW, RAW, WORKER, RoundsReport, Run, by_round

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


class TokenReport(RoundsReport[TokenLoadFigures], kw_only=True):
    open_episodes: OpenEpisodes | None = None


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


def ratios(runs: Sequence[Run]) -> dict[str, Spread]:
    """messages/s (so MB/s, tokens/s) of the worker over each other system's, per round."""
    return round_ratios(by_round(runs), WORKER, SYSTEMS)


def bars(report: TokenReport) -> list[Bar]:
    """Issue 26's bars (item 5), with their stretch targets where it gives one."""
    lat, opened = report.latency, report.open_episodes
    return [
        Bar(
            name="worker / raw pipeline, MB/s",
            op=">=",
            target=0.3,
            stretch=0.5,
            value=ratios(report.runs).get(f"{WORKER} / {RAW}"),
        ),
        Bar(
            name="end-to-end p99 at half load, s",
            op="<=",
            target=1.0,
            value=single(lat.p99_s if lat else None),
        ),
        Bar(
            name=f"peak RSS, {opened.episodes if opened else 10_000:,} open token episodes, MB",
            op="<=",
            target=1024.0,
            value=single(max(opened.peak_rss_mb, opened.restart_peak_rss_mb) if opened else None),
        ),
    ]


def to_json(report: TokenReport) -> bytes:
    return results_json(report, bars(report), summary=summary(report), ratios=ratios(report.runs))


def markdown(report: TokenReport) -> str:
    load = report.load
    lines = [
        *title("Token-plane benchmark", report),
        f"Load: {load.episodes:,} llm_call episodes, {load.messages:,} messages "
        f"({load.bytes / MB:,.1f} MB, mean {load.bytes / load.messages / 1000:.1f} kB), "
        f"{load.calls:,} calls of which {load.deltas:,} sent as deltas, over "
        f"{load.partitions} partitions; the output is {load.rows:,} tokens rows holding "
        f"{load.tokens:,} tokens. Produced once before the rounds to the topic kcat and "
        "the raw pipeline read and once per worker run to a topic of its own; "
        f"{report.rounds} round(s), each running {', '.join(SYSTEMS)} in turn.",
        "",
        row(
            "system",
            "tokens/s min / median / max",
            "MB/s min / median / max",
            "CPU ms per MB (median)",
            "peak RSS MB (median)",
        ),
        row("---", "---", "---", "---:", "---:"),
    ]
    for system, m in summary(report).items():
        lines.append(
            row(
                system,
                cells(m["tokens_per_s"]),
                cells(m["mb_per_s"]),
                num(m["cpu_ms_per_mb"].median),
                num(m["peak_rss_mb"].median),
            )
        )
    against = {s: per_round(by_round(report.runs), WORKER, s) for s in (RAW, KCAT)}
    lines += [
        "",
        row("round", "worker / raw pipeline", "worker / kcat"),
        row("---", "---:", "---:"),
    ]
    for n in range(1, report.rounds + 1):
        lines.append(row(n, *(num(a[n]) if n in a else "-" for a in against.values())))
    lines += ["", *bar_table(26, bars(report)), ""]
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
    return page(lines, report.notes)


def worker_rates(runs: Sequence[Run]) -> list[float]:
    return [r.events_per_s for r in runs if r.system == WORKER]
