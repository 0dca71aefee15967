"""Benchmark the assemble agent against a bare Faust agent that only decodes.

    python -m bench.bench_assemble [--bootstrap HOST:PORT] [--episodes 20000]
        [--rounds 3] [--open 100000]

1. Throughput: one pre-produced steps topic (episodes of 2-9 events, shuffled,
   5% duplicated, 100 episodes interleaved at a time), read in turn by a bare
   agent and by the real worker's assemble agent (``assemble.agent.attach``, without
   the sink, which the worker also runs), each in its
   own process and consumer group, ``--rounds`` times. The rate counts the
   events between 5% and 95% of the topic, so start-up and tail do not count.
2. Peak RSS (VmHWM) of a worker holding ``--open`` open episodes (start + 2
   steps each, no end) on the RocksDB store.
3. kill -9 of that worker, restart on the same data directory: seconds until it
   rebuilt its open episodes and until it consumes a new event again.

Each worker runs as ``python -m bench.bench_assemble child ...`` and prints its
counters every 50 ms; nothing here runs in the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from stream_export.contract.decoding import decode_event, encode
from stream_export.contract.events import EpisodeStart, Step, StepEvent
from stream_export.kafka import topics
from stream_export.runtime.metrics import Metrics
from stream_export.settings import Settings, load
from tests.support.processes import settings_args
from tests.support.producer import produce
from tests.support.traffic import Message, disorder

REPORT_EVERY = 0.05


def _child(argv: list[str]) -> None:
    """Run one agent (``bare`` or ``assemble``) and print its progress lines."""
    import faust

    from stream_export.assemble import agent as assemble
    from stream_export.runtime.app import create_app, declare_topics

    kind, overrides = argv[0], argv[1:]
    settings = load(env={}, overrides=overrides)
    metrics = Metrics()
    app = create_app(settings)
    declared = declare_topics(app, settings)
    if kind == "assemble":
        assemble.attach(app, declared, settings, metrics)  # the worker's stage, without the sink
    else:

        @app.agent(declared.steps, name="bare")
        async def bare(stream: Any) -> None:
            async for value in stream:
                decode_event(value)
                metrics.events_consumed.labels("any").inc()

    async def report() -> None:
        consumed = sum(
            s.value
            for f in metrics.events_consumed.collect()
            for s in f.samples
            if s.name.endswith("_total")
        )
        print(f"progress {time.time():.4f} {int(consumed)} {time.process_time():.4f}", flush=True)

    app.timer(REPORT_EVERY, name="bench-progress")(report)
    faust.Worker(
        app, loglevel=settings.worker.log_level, quiet=True, redirect_stdouts=False
    ).execute_from_commandline()


class Child:
    def __init__(self, kind: str, settings: Settings, log: Path) -> None:
        args = child_args(settings)
        self.log = log.open("ab")
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bench.bench_assemble", "child", kind, *args],
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            start_new_session=True,
        )

    def progress(self) -> Iterator[tuple[float, int, float]]:
        """(wall time, events consumed, CPU seconds of the worker process) readings."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("progress "):
                _, t, n, cpu = line.split()
                yield float(t), int(n), float(cpu)
        raise RuntimeError(f"child exited with {self.proc.wait()}; see {self.log.name}")

    def peak_rss_mb(self) -> float:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        kb = next(line.split()[1] for line in status.splitlines() if line.startswith("VmHWM"))
        return int(kb) / 1024

    def kill(self, sig: int = signal.SIGKILL) -> None:
        os.killpg(self.proc.pid, sig)
        self.proc.wait(60)
        self.log.close()


def child_args(settings: Settings) -> list[str]:
    """The overrides a child process loads ``settings`` back from."""
    return settings_args(settings)[1::2]  # the values of its --set flags


def _settings(bootstrap: str, token: str, *extra: str) -> Settings:
    return load(
        env={},
        overrides=[
            f"kafka.bootstrap_servers={bootstrap}",
            f"topics.steps=bench-{token}-steps",
            f"topics.episodes=bench-{token}-episodes",
            f"topics.dead_letters=bench-{token}-dlq",
            "topics.partitions=4",
            "http.enabled=false",
            *extra,
        ],
    )


def measure(child: Child, total: int) -> tuple[float, float]:
    """Events per second, and worker CPU microseconds per event, between 5% and
    95% of ``total`` consumed events."""
    lo, hi = total * 0.05, total * 0.95
    start: tuple[float, int, float] | None = None
    for t, n, cpu in child.progress():
        if start is None and n >= lo:
            start = (t, n, cpu)
        if n >= hi and start is not None:
            t0, n0, cpu0 = start
            return (n - n0) / (t - t0), (cpu - cpu0) / (n - n0) * 1e6
    raise AssertionError("unreachable")


def throughput(bootstrap: str, episodes: int, rounds: int, workdir: Path) -> None:
    token = uuid.uuid4().hex[:8]
    plan = disorder(episodes, seed=7, unended=0.0, window=100)
    total = len(plan.messages)
    base = _settings(bootstrap, token)
    asyncio.run(topics.ensure(base))
    started = time.time()
    asyncio.run(produce(bootstrap, base.topics.steps, plan.messages))
    print(
        f"produced {total} events ({episodes} episodes) in {time.time() - started:.1f}s", flush=True
    )
    rates: dict[str, list[float]] = {"bare": [], "assemble": []}
    cpus: dict[str, list[float]] = {"bare": [], "assemble": []}
    for r in range(rounds):
        for kind in rates:
            settings = _settings(
                bootstrap,
                token,
                f"worker.app_id=bench-{token}-{kind}-{r}",
                "worker.store=memory://",
                f"worker.data_dir={workdir / f'{kind}-{r}'}",
                f"sink.output_dir={workdir / f'{kind}-{r}'}",
            )
            child = Child(kind, settings, workdir / f"{kind}-{r}.log")
            try:
                rate, cpu = measure(child, total)
            finally:
                child.kill(signal.SIGTERM)
            rates[kind].append(rate)
            cpus[kind].append(cpu)
            print(
                f"round {r + 1} {kind:8s} {rate:8.0f} events/s {cpu:6.1f} CPU us/event",
                flush=True,
            )
    ratios = [a / b for a, b in zip(rates["assemble"], rates["bare"], strict=True)]
    for kind, values in rates.items():
        print(
            f"{kind:8s} best {max(values):.0f} events/s, spread "
            f"{min(values):.0f}-{max(values):.0f}, median {statistics.median(values):.0f}"
        )
    print(
        f"ratio assemble/bare per round: {', '.join(f'{r:.2f}' for r in ratios)}; "
        f"best-to-best {max(rates['assemble']) / max(rates['bare']):.2f}; "
        f"CPU per event, best each: bare {min(cpus['bare']):.0f} us, "
        f"assemble {min(cpus['assemble']):.0f} us "
        f"(ratio {min(cpus['bare']) / min(cpus['assemble']):.2f})"
    )


def _open_load(count: int, token: str) -> list[Message]:
    now = time.time()
    messages: list[Message] = []
    for n in range(count):
        eid = f"open-{token}-{n}"
        events: list[StepEvent] = [EpisodeStart(episode_id=eid, time=now, agent_id="a", prompt="p")]
        events += [
            Step(episode_id=eid, time=now, seq=i, kind="thought", content="x") for i in (0, 1)
        ]
        messages += [(eid.encode(), encode(e)) for e in events]
    return messages


def open_episodes(bootstrap: str, count: int, workdir: Path) -> None:
    token = uuid.uuid4().hex[:8]
    settings = _settings(
        bootstrap,
        token,
        f"worker.app_id=bench-{token}-open",
        "worker.store=rocksdb://",
        f"worker.data_dir={workdir / 'open'}",
        f"sink.output_dir={workdir / 'open'}",
    )
    asyncio.run(topics.ensure(settings))
    messages = _open_load(count, token)
    child = Child("assemble", settings, workdir / "open.log")
    next(child.progress())
    idle = child.peak_rss_mb()
    asyncio.run(produce(bootstrap, settings.topics.steps, messages))
    for _, n, _ in child.progress():
        if n >= len(messages):
            break
    time.sleep(2 * settings.assemble.persist_interval_s)  # the last chunks are written
    rss = child.peak_rss_mb()
    child.kill()
    print(
        f"{count} open episodes ({len(messages)} events) on RocksDB: peak RSS {rss:.0f} MB "
        f"(idle worker {idle:.0f} MB)",
        flush=True,
    )

    asyncio.run(produce(bootstrap, settings.topics.steps, _open_load(1, token + "-new")))
    log = workdir / "restart.log"
    restart = Child("assemble", settings, log)
    consuming = next(t for t, n, _ in restart.progress() if n >= 1)
    restart.kill(signal.SIGTERM)
    rebuilt = [line for line in log.read_text().splitlines() if "rebuilt in" in line]
    when = _log_time(rebuilt[0]) - restart.started if rebuilt else math.nan
    print(
        f"restart after kill -9: consuming again {consuming - restart.started:.1f}s after "
        f"start; open episodes rebuilt {when:.1f}s after start "
        f"({rebuilt[0].split('assemble: ')[-1].strip() if rebuilt else '?'}); "
        f"session timeout {settings.worker.session_timeout_s:.0f}s, static membership"
    )


def _log_time(line: str) -> float:
    """Epoch seconds of a Faust log line ``[2026-12-02 14:17:18,099] ...``."""
    stamp = line[1 : line.index("]")]
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "child":
        _child(argv[1:])
        return
    p = argparse.ArgumentParser(prog="python -m bench.bench_assemble", description=__doc__)
    p.add_argument(
        "--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:29092")
    )
    p.add_argument("--episodes", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--open", type=int, default=100_000)
    p.add_argument("--workdir", type=Path, default=None, help="default: a new temp dir")
    args = p.parse_args(argv)
    args.workdir = args.workdir or Path(tempfile.mkdtemp(prefix="bench-assemble-"))
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"logs in {args.workdir}", flush=True)
    if args.episodes:
        throughput(args.bootstrap, args.episodes, args.rounds, args.workdir)
    if args.open:
        open_episodes(args.bootstrap, args.open, args.workdir)


if __name__ == "__main__":
    main()
