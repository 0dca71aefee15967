"""A worker holding many open episodes on RocksDB: its peak memory, and how soon it
consumes again after a kill -9 (never in CI).

    python -m bench.open_episodes [--episodes 1000000] [--token-calls N] --bootstrap HOST:PORT

Produces one start event for each of ``--episodes`` episodes (with
``--token-calls N``, also its first N ``llm_call`` steps; none ends, and the
idle timeout is a day, so all stay open) to a fresh 4-partition steps topic,
runs the real worker until its ``open_episodes`` gauge holds them all and they
are persisted (its steps consumer lag is 0), kills it with SIGKILL, restarts it
on the same state, sends one complete episode and times it from the restart to
its record in the output file. Prints peak RSS (VmHWM) of both runs, the time to
take in the load, the rebuild time the worker logs and the time to consume again.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import time
import urllib.request
import uuid
from collections.abc import Callable
from pathlib import Path

from bench.bench_assemble import _settings
from bench.systems import peak_rss_mb
from bench.token_load import unended
from stream_export.contract.decoding import encode
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step
from stream_export.kafka import topics
from stream_export.output.follow import Follower
from stream_export.settings import Settings
from tests.support.monitoring import free_port
from tests.support.processes import Worker
from tests.support.producer import produce
from tests.support.waiting import wait_for

_METRIC = re.compile(
    r"^stream_export_(open_episodes|consumer_lag_messages)\{([^}]*)\} (\S+)$", re.M
)


def _scrape(port: int, steps: str) -> tuple[float, float] | None:
    """(open episodes, steps consumer lag) from the worker's /metrics, None if not up."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return None
    found = {"open_episodes": 0.0, "consumer_lag_messages": 0.0}
    lag_seen = False
    for name, labels, value in _METRIC.findall(text):
        if name == "consumer_lag_messages":
            if f'topic="{steps}"' not in labels:
                continue
            lag_seen = True
        found[name] += float(value)
    return (found["open_episodes"], found["consumer_lag_messages"]) if lag_seen else None


def _wait(what: str, worker: Worker, done: Callable[[], bool], timeout: float) -> float:
    """Seconds until ``done``; the worker must stay alive meanwhile."""
    started = time.monotonic()

    def check() -> bool:
        if not worker.alive():
            raise SystemExit(f"the worker stopped while {what}:\n{worker.log()[-3000:]}")
        return done()

    wait_for(check, timeout=timeout, interval=0.2, what=what)
    return time.monotonic() - started


def run(bootstrap: str, episodes: int, workdir: Path, calls: int = 0) -> dict[str, float]:
    """The figures of one run; ``calls`` > 0: each episode also has that many
    ``llm_call`` steps (bench.token_load's), else only its start."""
    workdir.mkdir(parents=True, exist_ok=True)
    token = uuid.uuid4().hex[:8]
    port = free_port()
    settings: Settings = _settings(
        bootstrap,
        token,
        f"worker.app_id=bench-{token}-open",
        "worker.store=rocksdb://",
        f"worker.data_dir={workdir / 'data'}",
        f"sink.output_dir={workdir / 'out'}",
        "assemble.idle_timeout_s=86400",
        "assemble.max_duration_s=172800",
        "assemble.window_expires_s=604800",
        "http.enabled=true",
        f"http.port={port}",
    )
    asyncio.run(topics.ensure(settings))
    t0 = time.time()
    if calls:
        starts = unended(episodes, calls, seed=17, now=t0)
    else:
        starts = [
            (
                f"open-{n}".encode(),
                encode(EpisodeStart(episode_id=f"open-{n}", time=t0, agent_id="a", prompt=f"p{n}")),
            )
            for n in range(episodes)
        ]
    results: dict[str, float] = {"mb": sum(len(v) for _, v in starts) / 1e6}
    print(f"producing {len(starts):,} events ({results['mb']:,.0f} MB)", flush=True)
    asyncio.run(produce(bootstrap, settings.topics.steps, starts))
    del starts

    log = workdir / "worker.log"
    worker = Worker(settings, log).start()
    assert worker.proc is not None
    try:

        def all_open() -> bool:
            got = _scrape(port, settings.topics.steps)
            # lag < 50: a few control ticks may be in flight
            return got is not None and got[0] >= episodes and got[1] < 50

        results["take_in_s"] = _wait("taking in the load", worker, all_open, 1800)
        results["peak_rss_mb"] = peak_rss_mb(worker.proc.pid)
        print(f"all open and persisted: {results}", flush=True)
        worker.kill9()

        restarted = time.monotonic()
        worker.start()
        assert worker.proc is not None
        follower = Follower(settings.sink.output_dir, settings.sink.prefix, wait=False)
        now = time.time()
        probe: list[EpisodeStart | Step | EpisodeEnd] = [
            EpisodeStart(episode_id="probe", time=now, agent_id="a", prompt="p"),
            Step(episode_id="probe", time=now, seq=0, kind="thought", content="t"),
            EpisodeEnd(episode_id="probe", time=now, steps=1, outcome="success"),
        ]
        asyncio.run(
            produce(bootstrap, settings.topics.steps, [(b"probe", encode(e)) for e in probe])
        )
        _wait("consuming again", worker, lambda: any(True for _ in follower.available()), 600)
        results["consume_again_s"] = time.monotonic() - restarted
        results["restart_peak_rss_mb"] = peak_rss_mb(worker.proc.pid)
        rebuilt = re.findall(r"rebuilt in ([\d.]+)s", worker.log())
        results["rebuild_s"] = float(rebuilt[-1]) if rebuilt else float("nan")
    finally:
        worker.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=1_000_000)
    parser.add_argument(
        "--token-calls",
        type=int,
        default=0,
        help="llm_call steps of each episode after its start (bench.token_load's; 0: none)",
    )
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench-open-episodes"))
    args = parser.parse_args(argv)
    results = run(
        args.bootstrap, args.episodes, args.workdir / uuid.uuid4().hex[:8], args.token_calls
    )
    print(
        f"{args.episodes:,} open episodes on RocksDB: taken in in {results['take_in_s']:.1f} s, "
        f"peak RSS {results['peak_rss_mb']:.0f} MB; after kill -9: consuming again in "
        f"{results['consume_again_s']:.1f} s (rebuild {results['rebuild_s']:.1f} s), "
        f"peak RSS {results['restart_peak_rss_mb']:.0f} MB"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
