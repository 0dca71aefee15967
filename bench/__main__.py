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
import asyncio
import contextlib
import math
import os
import platform
import statistics
import sys
import tempfile
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import msgspec

from bench.bench_assemble import _settings
from bench.latency import measure_latency
from bench.load import mean_size, pad
from bench.progress import Progress
from bench.report import (
    BARE,
    KCAT,
    RAW,
    SYSTEMS,
    WORKER,
    BenchError,
    Latency,
    Load,
    Report,
    Run,
    chart,
    markdown,
    to_json,
)
from bench.systems import (
    KCAT_MISSING,
    POLL_S,
    BareFaust,
    Handle,
    Kcat,
    RawPipeline,
    RealWorker,
    measure,
)
from stream_export.config import Settings
from stream_export.kafka import topics
from tests.support.own_broker import running
from tests.support.producer import produce
from tests.support.traffic import Plan, disorder

RESULTS: Final = Path(__file__).resolve().parent / "results"
#: Events per episode of tests.support.traffic.disorder: 2 + mean of 1-8 steps, +5%.
EVENTS_PER_EPISODE: Final = 6.5 * 1.05
#: Records carry the episode id, for the latency run; the same format everywhere.
FORMAT: Final = ("format.metadata_mode=columns", "format.metadata_fields=episode_id")
QUICK: Final = {"events": 20_000, "rounds": 1, "latency_seconds": 8.0}
DEFAULTS: Final = {"events": 180_000, "rounds": 3, "latency_seconds": 30.0}


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: {events:,} events, {rounds} round, {latency_seconds:.0f} s of "
        "latency".format(**QUICK),
    )
    p.add_argument("--bootstrap", help="use this broker instead of starting one")
    p.add_argument("--events", type=int, help=f"events in the topic ({DEFAULTS['events']:,})")
    p.add_argument("--event-bytes", type=int, default=313, help="message size (313)")
    p.add_argument("--rounds", type=int, help=f"rounds of all systems ({DEFAULTS['rounds']})")
    p.add_argument(
        "--latency-seconds",
        type=float,
        help=f"seconds of steady load for the latency (0: none; {DEFAULTS['latency_seconds']})",
    )
    p.add_argument(
        "--latency-rate", type=float, help="events/s for it (half the worker's median rate)"
    )
    p.add_argument("--timeout", type=float, help="seconds one run may take (120 + events/500)")
    p.add_argument("--workdir", type=Path, help="logs and outputs (a new temporary folder)")
    p.add_argument("--results", type=Path, default=RESULTS, help=f"where results go ({RESULTS})")
    args = p.parse_args(argv)
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.timeout = args.timeout or 120 + args.events / 500
    return args


class Bench:
    def __init__(self, args: argparse.Namespace, bootstrap: str, progress: Progress) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self.progress = progress
        self.workdir: Path = args.workdir
        self.token = uuid.uuid4().hex[:8]
        self.notes: list[str] = []

    def settings(self, token: str, name: str, *extra: str) -> Settings:
        """Settings of one run: its own group, data, output and episodes topic."""
        d = self.workdir / name
        d.mkdir(parents=True, exist_ok=True)
        return _settings(
            self.bootstrap,
            token,
            f"worker.app_id=bench-{token}-{name}",
            f"worker.data_dir={d / 'data'}",
            f"sink.output_dir={d / 'out'}",
            f"topics.episodes=bench-{token}-{name}-episodes",
            f"topics.dead_letters=bench-{token}-{name}-dlq",
            *extra,
        )

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
        """Produce the load, then run the rounds.

        The worker sends control ticks to its steps topic, which the bare agent
        cannot decode and the others would count, so each worker run reads its own
        copy of the load, produced here with the shared one, before any round.
        """
        args = self.args
        self.progress.step("producing the load")
        plan = self.load(max(1, round(args.events / EVENTS_PER_EPISODE)), seed=7, window=100)
        base = _settings(self.bootstrap, self.token)
        shared = base.topics.steps
        for topic in [shared] + [f"{shared}-worker-{r}" for r in range(1, args.rounds + 1)]:
            copy = msgspec.structs.replace(base.topics, steps=topic)
            asyncio.run(topics.ensure(msgspec.structs.replace(base, topics=copy)))
            asyncio.run(produce(self.bootstrap, topic, plan.messages))
        load = Load(
            events=len(plan.messages),
            episodes=plan.episodes,
            partitions=base.topics.partitions,
            mean_event_bytes=mean_size(plan),
        )
        runs: list[Run] = []
        for r in range(1, args.rounds + 1):
            for system, start in self.starters(shared, plan, r).items():
                self.progress.step(f"round {r}/{args.rounds}: {system}")
                if system == KCAT and not Kcat.available():
                    if KCAT_MISSING not in self.notes:
                        self.notes.append(KCAT_MISSING)
                        self.progress.note(KCAT_MISSING)
                    continue
                try:
                    run = measure(system, r, start, load.events, args.timeout, self.progress.show)
                except BenchError as exc:
                    self.notes.append(f"round {r}, {system}: {exc.detail} (logs in {self.workdir})")
                    self.progress.note(self.notes[-1])
                    continue
                runs.append(run)
                self.progress.note(
                    f"round {r} {system:12s} {run.events_per_s:9,.0f} events/s "
                    f"{run.cpu_us_per_event:7.1f} µs CPU/event {run.peak_rss_mb:6.0f} MB"
                )
        return load, runs

    def latency(self, runs: list[Run]) -> Latency | None:
        args = self.args
        rates = [r.events_per_s for r in runs if r.system == WORKER]
        rate = args.latency_rate or (statistics.median(rates) / 2 if rates else None)
        if not args.latency_seconds or rate is None:
            if args.latency_seconds:
                self.notes.append("no latency run: no worker rate measured (see --latency-rate)")
            return None
        self.progress.step(f"latency at {rate:,.0f} events/s")
        token = uuid.uuid4().hex[:8]
        settings = self.settings(token, "latency", *FORMAT)
        asyncio.run(topics.ensure(settings))
        seconds = args.latency_seconds
        plan = self.load(
            max(1, math.ceil(rate * seconds / EVENTS_PER_EPISODE)),
            seed=11,
            window=50,
            span=seconds,
        )
        warmup = self.load(1, seed=12, duplicates=0.0)
        try:
            return measure_latency(
                settings,
                self.workdir / "latency.log",
                warmup,
                plan,
                rate,
                args.timeout,
                self.progress.show,
            )
        except BenchError as exc:
            self.notes.append(f"latency: {exc.detail} (log in {self.workdir})")
            self.progress.note(self.notes[-1])
            return None


def _write(report: Report, results: Path, stem: str) -> list[Path]:
    results.mkdir(parents=True, exist_ok=True)
    png = results / f"{stem}.png"
    missing = chart(report, png)
    if missing:
        report.notes.append(missing)
    else:
        report.chart = png.name
    md, js = results / f"{stem}.md", results / f"{stem}.json"
    md.write_text(markdown(report))
    js.write_bytes(to_json(report))
    return [md, js] + ([] if missing else [png])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-pipeline-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    steps = 1 + args.rounds * len(SYSTEMS) + (1 if args.latency_seconds else 0)
    progress = Progress(steps)
    progress.note(f"logs and outputs in {args.workdir}")
    try:
        with contextlib.ExitStack() as stack:
            if args.bootstrap:
                bootstrap, broker = args.bootstrap, f"given, {args.bootstrap}"
            else:
                progress.note("starting a broker of its own (dev/kafka)")
                own = stack.enter_context(
                    contextlib.contextmanager(running)(args.workdir / "kafka")
                )
                bootstrap = own.address
                broker = f"its own dev/kafka at {bootstrap}"
            bench = Bench(args, bootstrap, progress)
            load, runs = bench.throughput()
            latency = bench.latency(runs)
    except BenchError as exc:
        progress.close()
        print(f"python -m bench: {exc.detail}", file=sys.stderr)
        return 1
    finally:
        progress.close()
    report = Report(
        date=now.strftime("%Y-%m-%d %H:%M UTC"),
        command=" ".join(["python -m bench", *argv]),
        machine=f"{os.cpu_count()} cores, {platform.system()}, Python {platform.python_version()}",
        broker=broker,
        load=load,
        rounds=args.rounds,
        poll_ms=POLL_S * 1000,
        runs=runs,
        latency=latency,
        notes=bench.notes,
    )
    stem = now.strftime("%Y-%m-%dT%H%MZ") + ("-quick" if args.quick else "")
    written = _write(report, args.results, stem)
    print(markdown(report))
    print("written: " + ", ".join(str(p) for p in written), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
