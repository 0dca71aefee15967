"""The benchmarks' results, whichever benchmark: figures over rounds (min / median /
max, ratios per round, percentiles), bars against an issue's targets, the
Markdown that shows them and the files under bench/results that keep them.

Every benchmark that writes results writes them through here: a Markdown page
that starts with its title, date, command, machine and broker and ends with its
notes, and a JSON file holding the same report and what is derived from it, as
``<date>[-<name>][-quick].md`` and ``.json``. A benchmark's own report (which
rows, which bars) is bench/pipeline_report.py, token_report.py, gateway_report.py,
or the report part of gateway_state.py, parquet.py and upload.py.

Everything here but :class:`Results` is pure.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import sys
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import msgspec

RESULTS: Final = Path(__file__).resolve().parent / "results"


# -- figures ----------------------------------------------------------------------


class Spread(msgspec.Struct):
    min: float
    median: float
    max: float


def spread(values: Sequence[float]) -> Spread:
    return Spread(min(values), statistics.median(values), max(values))


def single(value: float | None) -> Spread | None:
    """One figure as a spread (a bar's value measured once), or None."""
    return None if value is None else Spread(value, value, value)


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


def per_round(figures: Mapping[tuple[str, int], float], of: str, over: str) -> dict[int, float]:
    """Round -> ``of``'s figure over ``over``'s, in the rounds where both have one;
    ``figures`` is (system, round) -> figure."""
    return {
        n: value / figures[over, n]
        for (system, n), value in figures.items()
        if system == of and (over, n) in figures
    }


def round_ratios(
    figures: Mapping[tuple[str, int], float], of: str, others: Iterable[str]
) -> dict[str, Spread]:
    """``"<of> / <other>"`` -> ``of``'s figure over ``other``'s per round, min / median
    / max, for each of ``others`` in order but those never in a round with ``of``."""
    out: dict[str, Spread] = {}
    for other in others:
        if other != of and (got := per_round(figures, of, other)):
            out[f"{of} / {other}"] = spread(list(got.values()))
    return out


# -- bars -------------------------------------------------------------------------


def _holds(value: float, op: str, target: float) -> bool:
    return value >= target if op == ">=" else value <= target


class Bar(msgspec.Struct, kw_only=True):
    """One of an issue's bars and where this run stands (its median)."""

    name: str
    op: str
    target: float
    value: Spread | None
    #: The issue's stretch target, if it gives one.
    stretch: float | None = None

    @property
    def verdict(self) -> str:
        if self.value is None:
            return "not measured"
        return "met" if _holds(self.value.median, self.op, self.target) else "missed"

    @property
    def said(self) -> str:
        """The verdict, and whether the stretch was met too when the bar was."""
        if self.verdict != "met" or self.stretch is None or self.value is None:
            return self.verdict
        if _holds(self.value.median, self.op, self.stretch):
            return "met (and the stretch)"
        return "met (stretch not)"

    def to_builtins(self) -> dict[str, object]:
        """The bar as a results file gives it: its target, stretch, value and verdict."""
        return {
            "name": self.name,
            "target": f"{self.op} {self.target:g}",
            "stretch": self.stretch,
            "value": self.value,
            "verdict": self.verdict,
        }


# -- Markdown ---------------------------------------------------------------------


def num(value: float) -> str:
    """A figure with the precision it deserves: 3 significant digits, thousands commas."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    digits = max(0, 2 - math.floor(math.log10(abs(value))))
    return f"{value:,.{digits}f}"


def cells(s: Spread | None) -> str:
    """``min / median / max``, or ``-`` for nothing measured."""
    if s is None:
        return "-"
    return f"{num(s.min)} / {num(s.median)} / {num(s.max)}"


def row(*columns: object) -> str:
    """A Markdown table row."""
    return "| " + " | ".join(str(c) for c in columns) + " |"


class Heading(msgspec.Struct, kw_only=True):
    """What every results file starts with (:func:`heading`)."""

    date: str
    command: str
    machine: str
    #: None: the benchmark needs no broker.
    broker: str | None = None


class RoundsHeading(Heading, kw_only=True):
    """The heading of a benchmark run in alternating rounds (bench.harness)."""

    rounds: int
    poll_ms: float


def machine() -> str:
    return f"{os.cpu_count()} cores, {platform.system()}, Python {platform.python_version()}"


def heading(
    prog: str, argv: Sequence[str], now: datetime, broker: str | None = None
) -> dict[str, Any]:
    """The fields of a :class:`Heading` for a run of ``prog argv`` started ``now``."""
    return {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join([prog, *argv]),
        "machine": machine(),
        "broker": broker,
    }


def title(text: str, head: Heading, *more: str) -> list[str]:
    """A page's first lines: ``text`` and the date, then the command, the machine,
    the broker and ``more`` clauses in one sentence (which the caller may go on)."""
    clauses = [f"`{head.command}` on {head.machine}"]
    clauses += [f"broker: {head.broker}"] if head.broker is not None else []
    return [f"# {text}, {head.date}", "", "; ".join([*clauses, *more]) + "."]


def bar_table(issue: int, bars: Iterable[Bar]) -> list[str]:
    """The bars of ``issue`` as a table: target (stretch), min / median / max, verdict."""
    lines = [
        row(f"bar (issue {issue})", "target", "this run (min / median / max)", "verdict"),
        row("---", "---", "---", "---"),
    ]
    for bar in bars:
        target = f"{bar.op} {num(bar.target)}"
        if bar.stretch is not None:
            target += f" ({num(bar.stretch)})"
        lines.append(row(bar.name, target, cells(bar.value), bar.said))
    return lines


def page(lines: Iterable[str], notes: Iterable[str] = ()) -> str:
    """The Markdown of ``lines``, each of ``notes`` a paragraph of its own at the end."""
    return "\n".join([*lines, *(f"\nNote: {note}" for note in notes)]) + "\n"


# -- files ------------------------------------------------------------------------


def results_json(report: msgspec.Struct, bars: Iterable[Bar] = (), **derived: object) -> bytes:
    """The report, what is derived from it (summaries, ratios) and its bars, as
    indented JSON."""
    data = {**msgspec.to_builtins(report), **derived}
    if given := [b.to_builtins() for b in bars]:
        data["bars"] = given
    return msgspec.json.format(msgspec.json.encode(data)) + b"\n"


def results_option(parser: argparse.ArgumentParser) -> None:
    """``--results DIR``: where a benchmark writes its results."""
    parser.add_argument(
        "--results", type=Path, default=RESULTS, help=f"where results go ({RESULTS})"
    )


class Results:
    """The files of one run's results: ``<folder>/<date>[-<name>][-quick]`` and a
    suffix each (.md, .json, and what a benchmark draws beside them)."""

    def __init__(self, folder: Path, now: datetime, name: str = "", *, quick: bool = False):
        self.folder = folder
        self.stem = now.strftime("%Y-%m-%dT%H%MZ") + "".join(
            f"-{part}" for part in (name, "quick" if quick else "") if part
        )

    def path(self, suffix: str) -> Path:
        self.folder.mkdir(parents=True, exist_ok=True)
        return self.folder / f"{self.stem}{suffix}"

    def write(self, text: str, data: bytes, *drawn: Path) -> None:
        """``text`` (Markdown) and ``data`` (JSON) to their files; the Markdown
        printed, and every file written (``drawn`` beside them too) named on stderr."""
        md, js = self.path(".md"), self.path(".json")
        md.write_text(text)
        js.write_bytes(data)
        print(text)
        print("written: " + ", ".join(str(p) for p in (md, js, *drawn)), file=sys.stderr)
