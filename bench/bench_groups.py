"""The groups stages' throughput, for two or more checkouts side by side in
alternating rounds (never in CI):

    python -m bench.bench_groups --bootstrap HOST:PORT --tree old=/path/a --tree new=/path/b \\
        [--rollouts 16000] [--size 8] [--rounds 3]

Each round, for each checkout in turn: a fresh app id (fresh topics), the rollouts
(groups of ``--size``, each rollout ~1 KB, shuffled) published to its episodes
topic before the worker starts, then ``stream-export worker`` of that checkout
(its own ``.venv``) with ``groups.enabled=true`` until every group's row is in
the groups output. Reported per checkout: rollouts per second from the first
group row to the last (the worker's start-up left out), and the worker's CPU
seconds, min/median/max over the rounds; then the ratios to the first checkout.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import msgspec

from bench.systems import cpu_seconds
from stream_export import settings
from stream_export.contract.episode import Episode
from stream_export.contract.events import Step
from tests.support.monitoring import free_port
from tests.support.sinkkafka import publish


def rollouts(n: int, size: int, seed: int) -> list[tuple[bytes, bytes]]:
    rng, now, out = random.Random(seed), time.time(), []
    for i in range(n):
        group, eid = f"g{i // size}", f"g{i // size}-r{i % size}"
        episode = Episode(
            episode_id=eid,
            agent_id="bench",
            prompt=f"task {group}",
            steps=[Step(episode_id=eid, time=now, seq=0, kind="output", content="x" * 800)],
            start_time=now - 1,
            end_time=now,
            outcome="success",
            group_id=group,
            group_size=size,
            reward=float(rng.random() < 0.5),
        )
        out.append((eid.encode(), msgspec.json.encode(episode)))
    rng.shuffle(out)
    return out


def group_rows(out: Path) -> int:
    return sum(path.read_bytes().count(b"\n") for path in out.glob("*.groups*.jsonl"))


def one(tree: Path, bootstrap: str, n: int, size: int, work: Path) -> tuple[float, float]:
    """(rollouts per second from the first group row to the last, worker CPU seconds)."""
    app = f"bg-{uuid.uuid4().hex[:8]}"
    out = work / app
    # Only these settings reach the worker (each checkout knows its own defaults).
    overrides = [
        f"kafka.bootstrap_servers={bootstrap}",
        f"worker.app_id={app}",
        f"worker.data_dir={work / (app + '-state')}",
        f"sink.output_dir={out}",
        "groups.enabled=true",
        "groups.timeout_s=600",
        "topics.partitions=4",
        f"http.port={free_port()}",
        f"http.probe_port={free_port()}",
    ]
    s = settings.load(env={}, overrides=overrides)
    publish(s, rollouts(n, size, seed=1))
    log = (work / f"{app}.log").open("wb")
    proc = subprocess.Popen(
        [str(tree / ".venv/bin/python"), "-m", "stream_export", "worker"]
        + [arg for o in overrides for arg in ("--set", o)],
        cwd=tree,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    want, first, deadline = n // size, None, time.monotonic() + 600
    try:
        while True:
            rows = group_rows(out) if out.exists() else 0
            if rows and first is None:
                first = (time.monotonic(), rows)
            if rows >= want:
                break
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"{tree}: {rows}/{want} group rows; see {log.name}")
            time.sleep(0.05)
        assert first is not None
        elapsed = max(time.monotonic() - first[0], 1e-3)
        return (want - first[1]) * size / elapsed, cpu_seconds(proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--tree", action="append", required=True, help="name=path")
    parser.add_argument("--rollouts", type=int, default=16000)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trees = dict(t.split("=", 1) for t in args.tree)
    rates: dict[str, list[float]] = {name: [] for name in trees}
    cpus: dict[str, list[float]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name, path in trees.items():
                rate, cpu = one(Path(path), args.bootstrap, args.rollouts, args.size, Path(tmp))
                rates[name].append(rate)
                cpus[name].append(cpu)
                print(f"round {r + 1} {name}: {rate:,.0f} rollouts/s, {cpu:.1f} CPU s", flush=True)
    base = next(iter(trees))
    print("| checkout | rollouts/s min / median / max | CPU s median | median rate vs first |")
    print("| --- | --- | --- | --- |")
    for name in trees:
        rs = sorted(rates[name])
        ratio = statistics.median(rs) / statistics.median(rates[base])
        line = f"{rs[0]:,.0f} / {statistics.median(rs):,.0f} / {rs[-1]:,.0f}"
        cpu = statistics.median(cpus[name])
        print(f"| {name} | {line} | {cpu:.1f} | {ratio:.2f} |")


if __name__ == "__main__":
    main()
