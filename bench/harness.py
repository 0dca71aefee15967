"""What the pipeline benchmark (``python -m bench``) and the token-plane benchmark
(``python -m bench.tokens``) share: the defaults of their options, the broker, each
run's settings, the load's copies and the alternating rounds."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import statistics
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from bench import BenchError
from bench.bench_assemble import _settings
from bench.latency import measure_latency
from bench.progress import Progress
from bench.report import heading, results_option
from bench.runs import KCAT, WORKER, Latency, Run
from bench.systems import KCAT_MISSING, POLL_S, Handle, Kcat, measure
from stream_export.kafka import topics
from stream_export.settings import Settings
from tests.support.own_broker import running
from tests.support.producer import produce
from tests.support.traffic import Plan

Parser = argparse.ArgumentParser
T = TypeVar("T")


def parser(prog: str, doc: str | None, quick: str, full: Mapping[str, Any]) -> Parser:
    """The options both benchmarks have; ``quick`` says what --quick runs, ``full``
    holds the defaults of the full run (``rounds``, ``latency_seconds``)."""
    p = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--quick", action="store_true", help=f"a smoke run: {quick}")
    p.add_argument("--bootstrap", help="use this broker instead of starting one")
    p.add_argument("--rounds", type=int, help=f"rounds of all systems ({full['rounds']})")
    p.add_argument(
        "--latency-seconds",
        type=float,
        help=f"seconds of steady load for the latency (0: none; {full['latency_seconds']})",
    )
    p.add_argument(
        "--latency-rate", type=float, help="messages/s for it (half the worker's median rate)"
    )
    p.add_argument("--workdir", type=Path, help="logs and outputs (a new temporary folder)")
    results_option(p)
    return p


def defaults(args: argparse.Namespace, quick: Mapping[str, Any], full: Mapping[str, Any]) -> None:
    """Fill the options not given from the --quick or the full run's values, and
    make the work folder."""
    for name, value in (quick if args.quick else full).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-"))
    args.workdir.mkdir(parents=True, exist_ok=True)


@contextlib.contextmanager
def broker(args: argparse.Namespace, progress: Progress) -> Iterator[tuple[str, str]]:
    """(bootstrap, how the report names it): --bootstrap's, or dev/kafka of its own
    in the work folder, stopped when done."""
    if args.bootstrap:
        yield args.bootstrap, f"given, {args.bootstrap}"
        return
    progress.note("starting a broker of its own (dev/kafka)")
    with contextlib.contextmanager(running)(args.workdir / "kafka") as own:
        yield own.address, f"its own dev/kafka at {own.address}"


def on_broker(
    prog: str, args: argparse.Namespace, progress: Progress, body: Callable[[str], T]
) -> tuple[T, str] | None:
    """``body(bootstrap)`` on the run's broker: its result and the broker's name for
    the report; None when it failed with a BenchError (said on stderr)."""
    progress.note(f"logs and outputs in {args.workdir}")
    try:
        with broker(args, progress) as (bootstrap, where):
            return body(bootstrap), where
    except BenchError as exc:
        progress.close()
        print(f"{prog}: {exc.detail}", file=sys.stderr)
        return None
    finally:
        progress.close()


def rounds_heading(
    prog: str, argv: list[str], args: argparse.Namespace, now: datetime, where: str
) -> dict[str, Any]:
    """The fields of a report's RoundsHeading."""
    return {
        **heading(prog, argv, now, where),
        "rounds": args.rounds,
        "poll_ms": POLL_S * 1000,
    }


class Harness:
    """One benchmark run on one broker: its settings, notes and rounds."""

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

    def note(self, text: str) -> None:
        self.notes.append(text)
        self.progress.note(text)

    def copies(self, messages: Sequence[tuple[bytes, bytes]], shared: bool = True) -> Settings:
        """Produce ``messages`` to a fresh steps topic (unless not ``shared``) and to
        one per worker run (``<topic>-worker-<round>``): the worker sends control
        ticks to its steps topic, which the other systems would count."""
        base = _settings(self.bootstrap, self.token)
        steps = base.topics.steps
        rounds = range(1, self.args.rounds + 1)
        for topic in ([steps] if shared else []) + [f"{steps}-worker-{r}" for r in rounds]:
            copy = msgspec.structs.replace(base.topics, steps=topic)
            asyncio.run(topics.ensure(msgspec.structs.replace(base, topics=copy)))
            asyncio.run(produce(self.bootstrap, topic, messages))
        return base

    def rounds(
        self,
        starters: Callable[[int], dict[str, Callable[[], Handle]]],
        messages: int,
        done: Callable[[Run], str],
    ) -> list[Run]:
        """Each round runs every system of ``starters(round)`` in turn, measured over
        ``messages``; ``done`` says what a progress line shows of a run."""
        runs: list[Run] = []
        for r in range(1, self.args.rounds + 1):
            for system, start in starters(r).items():
                self.progress.step(f"round {r}/{self.args.rounds}: {system}")
                if system == KCAT and not Kcat.available():
                    if KCAT_MISSING not in self.notes:
                        self.note(KCAT_MISSING)
                    continue
                try:
                    run = measure(system, r, start, messages, self.args.timeout, self.progress.show)
                except BenchError as exc:
                    self.note(f"round {r}, {system}: {exc.detail} (logs in {self.workdir})")
                    continue
                runs.append(run)
                self.progress.note(f"round {r} {system:12s} {done(run)}")
        return runs

    def latency(
        self,
        runs: list[Run],
        per_episode: float,
        plans: Callable[[int], tuple[Plan, Plan]],
        extra: Sequence[str],
        unit: str,
        episode_of: Callable[[bytes], str] | None = None,
    ) -> Latency | None:
        """A new worker (settings ``extra``) fed at --latency-rate or half the workers'
        median rate for --latency-seconds; ``plans(episodes)`` gives the warm-up and
        the load, ``per_episode`` messages each."""
        args = self.args
        rates = [r.events_per_s for r in runs if r.system == WORKER]
        rate = args.latency_rate or (statistics.median(rates) / 2 if rates else None)
        if not args.latency_seconds or rate is None:
            if args.latency_seconds:
                self.notes.append("no latency run: no worker rate measured (see --latency-rate)")
            return None
        self.progress.step(f"latency at {rate:,.0f} {unit}/s")
        settings = self.settings(uuid.uuid4().hex[:8], "latency", *extra)
        asyncio.run(topics.ensure(settings))
        warmup, plan = plans(max(1, math.ceil(rate * args.latency_seconds / per_episode)))
        try:
            return measure_latency(
                settings,
                self.workdir / "latency.log",
                warmup,
                plan,
                rate,
                args.timeout,
                self.progress.show,
                episode_of=episode_of,
            )
        except BenchError as exc:
            self.note(f"latency: {exc.detail} (log in {self.workdir})")
            return None
