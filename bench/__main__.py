"""The whole pipeline, side by side with its baselines, in one command (never in CI).

    python -m bench [--quick] [--bootstrap HOST:PORT] [--events 180000] [--rounds 3]

Generates the load (tests.support.traffic's episodes: 2-9 events, shuffled within
each episode, 5% duplicated, 100 interleaved; every message padded to about
``--event-bytes``), produces it once to a fresh 4-partition steps topic, then
runs in alternating rounds (round 1: A B C D, round 2: A B C D, ...), each
system in its own process and consumer group:

  A  kcat reading the topic to a file (Debian package kcat)
  B  a hand-written aiokafka getmany pipeline doing the whole job
     (bench/raw_pipeline.py: decode, assemble, format, write JSONL, commit)
  C  a bare Faust agent that only decodes (bench/bench_assemble.py's)
  D  the real worker, `stream-export worker`, steps topic to lines in its file

Then, at half the worker's median rate, episodes are produced at a steady rate
into a new topic while a new worker runs, for the end-to-end latency.

Without --bootstrap it starts a broker of its own (dev/kafka, free port, own
state folder under the work folder) and stops it at the end. Results go to
bench/results/<date>.json, .md and .png (the chart needs matplotlib) and the
Markdown is printed. Defaults take about 10 minutes on 2 idle cores; --quick
(20,000 events, 1 round, 8 s of latency) about a minute (two on a busy machine).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final

from bench.harness import Harness, defaults, on_broker, parser, rounds_heading
from bench.load import mean_size, pad
from bench.pipeline_report import SYSTEMS, Load, Report, chart, markdown, to_json
from bench.progress import Progress
from bench.report import Results
from bench.runs import BARE, KCAT, RAW, WORKER, Latency, Run
from bench.systems import (
    BareFaust,
    Handle,
    Kcat,
    RawPipeline,
    RealWorker,
)
from tests.support.traffic import Plan, disorder

#: Events per episode of tests.support.traffic.disorder: 2 + mean of 1-8 steps, +5%.
EVENTS_PER_EPISODE: Final = 6.5 * 1.05
#: Records carry the episode id, for the latency run; the same format everywhere.
FORMAT: Final = ("format.metadata_mode=columns", "format.metadata_fields=episode_id")
PROG: Final = "python -m bench"
QUICK: Final = {"events": 20_000, "rounds": 1, "latency_seconds": 8.0}
DEFAULTS: Final = {"events": 180_000, "rounds": 3, "latency_seconds": 30.0}


def parse(argv: list[str]) -> argparse.Namespace:
    quick = "{events:,} events, {rounds} round, {latency_seconds:.0f} s of latency"
    p = parser(PROG, __doc__, quick.format(**QUICK), DEFAULTS)
    p.add_argument("--events", type=int, help=f"events in the topic ({DEFAULTS['events']:,})")
    p.add_argument("--event-bytes", type=int, default=313, help="message size (313)")
    p.add_argument("--timeout", type=float, help="seconds one run may take (120 + events/500)")
    args = p.parse_args(argv)
    defaults(args, QUICK, DEFAULTS)
    args.timeout = args.timeout or 120 + args.events / 500
    return args


class Bench(Harness):
    def load(
        self, episodes: int, seed: int, window: int = 50, duplicates: float = 0.05, span: float = 1
    ) -> Plan:
        plan = disorder(
            episodes, seed=seed, duplicates=duplicates, unended=0.0, window=window, span_s=span
        )
        return pad(plan, self.args.event_bytes)

    def starters(self, topic: str, plan: Plan, r: int) -> dict[str, Callable[[], Handle]]:
        """How to start each system for round ``r`` on ``plan``, produced to ``topic``
        (the worker's own copy is the round's ``-worker-<r>`` topic)."""
        events, records = len(plan.messages), len(plan.ended)
        token, d = self.token, self.workdir

        def kcat() -> Handle:
            return Kcat(self.bootstrap, topic, d / "kcat.out", events)

        def raw() -> Handle:
            s = self.settings(token, f"raw-{r}", *FORMAT)
            return RawPipeline(s, d / f"raw-{r}.jsonl", d / f"raw-{r}.log", records)

        def bare() -> Handle:
            return BareFaust(self.settings(token, f"bare-{r}"), d / f"bare-{r}.log", events)

        def worker() -> Handle:
            s = self.settings(token, f"worker-{r}", f"topics.steps={topic}-worker-{r}", *FORMAT)
            return RealWorker(s, d / f"worker-{r}.log", records)

        return {KCAT: kcat, RAW: raw, BARE: bare, WORKER: worker}

    def throughput(self) -> tuple[Load, list[Run]]:
        """Produce the load (once shared, once per worker run), then run the rounds."""
        args = self.args
        self.progress.step("producing the load")
        plan = self.load(max(1, round(args.events / EVENTS_PER_EPISODE)), seed=7, window=100)
        base = self.copies(plan.messages)
        load = Load(
            events=len(plan.messages),
            episodes=plan.episodes,
            partitions=base.topics.partitions,
            mean_event_bytes=mean_size(plan),
        )

        def done(run: Run) -> str:
            return (
                f"{run.events_per_s:9,.0f} events/s {run.cpu_us_per_event:7.1f} µs CPU/event "
                f"{run.peak_rss_mb:6.0f} MB"
            )

        runs = self.rounds(lambda r: self.starters(base.topics.steps, plan, r), load.events, done)
        return load, runs

    def latency_run(self, runs: list[Run]) -> Latency | None:
        seconds = self.args.latency_seconds

        def plans(episodes: int) -> tuple[Plan, Plan]:
            warmup = self.load(1, seed=12, duplicates=0.0)
            return warmup, self.load(episodes, seed=11, window=50, span=seconds)

        return self.latency(runs, EVENTS_PER_EPISODE, plans, FORMAT, "events")


def _write(report: Report, results: Results) -> None:
    """The chart (when matplotlib can draw it), then the Markdown and the JSON."""
    png = results.path(".png")
    missing = chart(report, png)
    if missing:
        report.notes.append(missing)
    else:
        report.chart = png.name
    results.write(markdown(report), to_json(report), *([] if missing else [png]))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    now = datetime.now(UTC)
    steps = 1 + args.rounds * len(SYSTEMS) + (1 if args.latency_seconds else 0)
    progress = Progress(steps)

    def body(bootstrap: str) -> tuple[Bench, Load, list[Run], Latency | None]:
        bench = Bench(args, bootstrap, progress)
        load, runs = bench.throughput()
        return bench, load, runs, bench.latency_run(runs)

    done = on_broker(PROG, args, progress, body)
    if done is None:
        return 1
    (bench, load, runs, latency), where = done
    report = Report(
        **rounds_heading(PROG, argv, args, now, where),
        load=load,
        runs=runs,
        latency=latency,
        notes=bench.notes,
    )
    _write(report, Results(args.results, now, quick=args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
