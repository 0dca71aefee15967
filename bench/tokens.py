"""The token plane's benchmark (issue 26, item 5), in one command (never in CI).

    python -m bench.tokens [--quick] [--bootstrap HOST:PORT] [--episodes 2000] [--rounds 3]

Generates bench.token_load's llm_call episodes (seeded: 2-8 calls, prompts of
1,000-4,096 tokens sent as deltas, completions of 100-1,000 tokens, float32
logprobs), produces them once to a fresh 4-partition steps topic (and once per
worker run to a topic of its own: the worker writes control ticks to its steps
topic), then runs in alternating rounds, each system in its own process and
consumer group:

  A  kcat reading the topic to a file
  B  bench/raw_tokens.py: a hand-written aiokafka pipeline (not the project's
     code) that decodes the calls, rebuilds the sequences and appends the rows
  C  the real worker, `stream-export worker` with format.format=tokens

Then a new worker gets episodes at half its median rate for the end-to-end
latency, and bench.open_episodes holds 10,000 token episodes open (a start and
3 calls each) for the peak RSS. Reports tokens/s and MB/s (min/median/max), the
ratios per round and the bars to bench/results/<date>-tokens.md and .json.
Without --bootstrap it starts a broker of its own (dev/kafka) and stops it at
the end.
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
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import msgspec

from bench import open_episodes
from bench.bench_assemble import _settings
from bench.latency import measure_latency
from bench.progress import Progress
from bench.raw_tokens import FETCH_BYTES
from bench.report import KCAT, RAW, WORKER, BenchError, Latency, Run
from bench.systems import KCAT_MISSING, POLL_S, Handle, Kcat, RawTokens, RealWorker, measure
from bench.token_load import TokenLoad, generate
from bench.token_report import (
    SYSTEMS,
    OpenEpisodes,
    TokenLoadFigures,
    TokenReport,
    markdown,
    to_json,
    worker_rates,
)
from stream_export.config import Settings
from stream_export.kafka import topics
from tests.support.own_broker import running
from tests.support.producer import produce
from tests.support.traffic import Plan

RESULTS: Final = Path(__file__).resolve().parent / "results"
TOKENS: Final = ("format.format=tokens",)
QUICK: Final = {"episodes": 200, "rounds": 1, "latency_seconds": 8.0, "open_episodes": 1000}
DEFAULTS: Final = {"episodes": 2000, "rounds": 3, "latency_seconds": 30.0, "open_episodes": 10_000}
OPEN_CALLS: Final = 3
_EPISODE_ID: Final = b'"episode_id": "'


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m bench.tokens",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: {episodes:,} episodes, {rounds} round, {latency_seconds:.0f} s of "
        "latency, {open_episodes:,} open episodes".format(**QUICK),
    )
    p.add_argument("--bootstrap", help="use this broker instead of starting one")
    p.add_argument("--episodes", type=int, help=f"episodes in the topic ({DEFAULTS['episodes']:,})")
    p.add_argument("--rounds", type=int, help=f"rounds of all systems ({DEFAULTS['rounds']})")
    p.add_argument(
        "--latency-seconds",
        type=float,
        help=f"seconds of steady load for the latency (0: none; {DEFAULTS['latency_seconds']})",
    )
    p.add_argument(
        "--latency-rate", type=float, help="messages/s for it (half the worker's median rate)"
    )
    p.add_argument(
        "--open-episodes",
        type=int,
        help=f"open token episodes for the peak RSS (0: none; {DEFAULTS['open_episodes']:,})",
    )
    p.add_argument(
        "--raw-fetch-bytes",
        type=int,
        default=FETCH_BYTES,
        help=f"the raw pipeline's max_partition_fetch_bytes ({FETCH_BYTES:,}, aiokafka's default)",
    )
    p.add_argument("--timeout", type=float, help="seconds one run may take (120 + episodes/5)")
    p.add_argument("--workdir", type=Path, help="logs and outputs (a new temporary folder)")
    p.add_argument("--results", type=Path, default=RESULTS, help=f"where results go ({RESULTS})")
    args = p.parse_args(argv)
    for name, value in (QUICK if args.quick else DEFAULTS).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.timeout = args.timeout or 120 + args.episodes / 5
    return args


def episode_of(row: bytes) -> str:
    """A tokens row's episode id, found without decoding its arrays (on two shared
    cores, decoding every row in the bench's process slows the worker it watches):
    the arrays hold only numbers, so the first ``"episode_id": "`` is the column."""
    start = row.index(_EPISODE_ID) + len(_EPISODE_ID)
    return row[start : row.index(b'"', start)].decode()


def _plan(load: TokenLoad) -> Plan:
    return Plan(messages=load.messages, ended=dict(load.ended))


class TokenBench:
    def __init__(self, args: argparse.Namespace, bootstrap: str, progress: Progress) -> None:
        self.args = args
        self.bootstrap = bootstrap
        self.progress = progress
        self.workdir: Path = args.workdir
        self.token = uuid.uuid4().hex[:8]
        self.notes: list[str] = [
            f"the raw pipeline fetches up to {args.raw_fetch_bytes:,} bytes a partition "
            "(max_partition_fetch_bytes; the worker's consumers 1,048,576)"
        ]

    def settings(self, token: str, name: str, *extra: str) -> Settings:
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
            *TOKENS,
            *extra,
        )

    def starters(self, topic: str, load: TokenLoad, r: int) -> dict[str, Callable[[], Handle]]:
        d = self.workdir

        def kcat() -> Handle:
            return Kcat(self.bootstrap, topic, d / "kcat.out", len(load.messages))

        def raw() -> Handle:
            group = f"bench-{self.token}-raw-{r}"
            out, log = d / f"raw-{r}.jsonl", d / f"raw-{r}.log"
            fetch = self.args.raw_fetch_bytes
            return RawTokens(self.bootstrap, topic, group, out, log, load.rows, fetch)

        def worker() -> Handle:
            s = self.settings(self.token, f"worker-{r}", f"topics.steps={topic}-worker-{r}")
            return RealWorker(s, d / f"worker-{r}.log", load.rows)

        return {KCAT: kcat, RAW: raw, WORKER: worker}

    def throughput(self) -> tuple[TokenLoadFigures, list[Run]]:
        args = self.args
        self.progress.step("producing the load")
        load = generate(args.episodes, seed=26, now=time.time())
        base = _settings(self.bootstrap, self.token)
        shared = base.topics.steps
        produced = [shared] if args.rounds else []  # --rounds 0: only what follows
        for topic in produced + [f"{shared}-worker-{r}" for r in range(1, args.rounds + 1)]:
            copy = msgspec.structs.replace(base.topics, steps=topic)
            asyncio.run(topics.ensure(msgspec.structs.replace(base, topics=copy)))
            asyncio.run(produce(self.bootstrap, topic, load.messages))
        figures = TokenLoadFigures(
            episodes=load.episodes,
            messages=len(load.messages),
            calls=load.calls,
            deltas=load.deltas,
            rows=load.rows,
            tokens=load.tokens,
            bytes=load.bytes,
            partitions=base.topics.partitions,
        )
        runs: list[Run] = []
        for r in range(1, args.rounds + 1):
            for system, start in self.starters(shared, load, r).items():
                self.progress.step(f"round {r}/{args.rounds}: {system}")
                if system == KCAT and not Kcat.available():
                    if KCAT_MISSING not in self.notes:
                        self.notes.append(KCAT_MISSING)
                    continue
                try:
                    run = measure(
                        system, r, start, figures.messages, args.timeout, self.progress.show
                    )
                except BenchError as exc:
                    self.notes.append(f"round {r}, {system}: {exc.detail} (logs in {self.workdir})")
                    self.progress.note(self.notes[-1])
                    continue
                runs.append(run)
                mb = run.events_per_s * figures.bytes / figures.messages / 1e6
                self.progress.note(
                    f"round {r} {system:12s} {mb:7.1f} MB/s "
                    f"{run.events_per_s * figures.tokens / figures.messages:11,.0f} tokens/s "
                    f"{run.peak_rss_mb:6.0f} MB RSS"
                )
        return figures, runs

    def latency(self, runs: list[Run], per_episode: float) -> Latency | None:
        rates = worker_rates(runs)
        seconds = self.args.latency_seconds
        if not seconds or not (rates or self.args.latency_rate):
            if seconds:
                self.notes.append("no latency run: no worker rate measured")
            return None
        rate = self.args.latency_rate or statistics.median(rates) / 2
        self.progress.step(f"latency at {rate:,.0f} messages/s")
        token = uuid.uuid4().hex[:8]
        settings = self.settings(token, "latency")
        asyncio.run(topics.ensure(settings))
        episodes = max(1, math.ceil(rate * seconds / per_episode))
        plan = _plan(generate(episodes, seed=27, now=time.time()))
        warmup = _plan(generate(1, seed=28, now=time.time()))
        try:
            return measure_latency(
                settings,
                self.workdir / "latency.log",
                warmup,
                plan,
                rate,
                self.args.timeout,
                self.progress.show,
                episode_of=episode_of,
            )
        except BenchError as exc:
            self.notes.append(f"latency: {exc.detail} (log in {self.workdir})")
            self.progress.note(self.notes[-1])
            return None

    def open_episodes(self) -> OpenEpisodes | None:
        n = self.args.open_episodes
        if not n:
            return None
        self.progress.step(f"{n:,} open token episodes")
        got = open_episodes.run(self.bootstrap, n, self.workdir / "open", calls=OPEN_CALLS)
        return OpenEpisodes(episodes=n, calls=OPEN_CALLS, **got)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-tokens-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    steps = 1 + args.rounds * len(SYSTEMS) + bool(args.latency_seconds) + bool(args.open_episodes)
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
            bench = TokenBench(args, bootstrap, progress)
            load, runs = bench.throughput()
            latency = bench.latency(runs, load.messages / load.episodes)
            opened = bench.open_episodes()
    except BenchError as exc:
        print(f"python -m bench.tokens: {exc.detail}", file=sys.stderr)
        return 1
    finally:
        progress.close()
    report = TokenReport(
        date=now.strftime("%Y-%m-%d %H:%M UTC"),
        command=" ".join(["python -m bench.tokens", *argv]),
        machine=f"{os.cpu_count()} cores, {platform.system()}, Python {platform.python_version()}",
        broker=broker,
        load=load,
        rounds=args.rounds,
        poll_ms=POLL_S * 1000,
        runs=runs,
        latency=latency,
        open_episodes=opened,
        notes=bench.notes,
    )
    stem = now.strftime("%Y-%m-%dT%H%MZ") + "-tokens" + ("-quick" if args.quick else "")
    args.results.mkdir(parents=True, exist_ok=True)
    md, js = args.results / f"{stem}.md", args.results / f"{stem}.json"
    md.write_text(markdown(report))
    js.write_bytes(to_json(report))
    print(markdown(report))
    print(f"written: {md}, {js}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
