"""Does Faust's fixed 1.5 s fetch wait, with its leader topic, hold back the
worker's latency? (issue 12's hypothesis; never in CI)

    python -m bench.probe_fetch_wait --bootstrap HOST:PORT [--rate 8000] [--rounds 2]

Runs the end-to-end latency measurement of ``python -m bench`` at one rate, in
alternating rounds, for the worker as shipped (100 ms fetch wait, no leader
topic) and for the same worker with Faust's settings put back (1.5 s, leader
topic on), and prints p50/p90/p99/max of each round.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import uuid
from pathlib import Path

from bench.__main__ import EVENTS_PER_EPISODE, FORMAT, Bench, parse
from bench.latency import measure_latency
from bench.progress import Progress
from stream_export.kafka import topics

#: Faust's own: the consumer's fetch_max_wait_ms and the leader topic.
FAUST_DEFAULTS = """
import stream_export.runtime.patches.consumer, stream_export.runtime.app
stream_export.runtime.patches.consumer.FETCH_MAX_WAIT_MS = 1500
_create_app = stream_export.runtime.app.create_app
def create_app(settings, **overrides):
    return _create_app(settings, topic_disable_leader=False, **overrides)
stream_export.runtime.app.create_app = create_app
import stream_export.ops.worker
stream_export.ops.worker.create_app = create_app
"""
VARIANTS = {
    "shipped (100 ms, no leader topic)": None,
    "Faust's (1.5 s, leader topic)": FAUST_DEFAULTS,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--rate", type=float, default=8000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench-fetch-wait"))
    args = parser.parse_args(argv)
    bench = Bench(
        parse(["--bootstrap", args.bootstrap, "--workdir", str(args.workdir)]),
        args.bootstrap,
        Progress(1),
    )
    for r in range(1, args.rounds + 1):
        for name, prelude in VARIANTS.items():
            token = uuid.uuid4().hex[:8]
            settings = bench.settings(token, f"latency-{r}-{token}", *FORMAT)
            asyncio.run(topics.ensure(settings))
            episodes = max(1, math.ceil(args.rate * args.seconds / EVENTS_PER_EPISODE))
            plan = bench.load(episodes, seed=11, window=50, span=args.seconds)
            warmup = bench.load(1, seed=12, duplicates=0.0)
            got = measure_latency(
                settings,
                args.workdir / f"{token}.log",
                warmup,
                plan,
                args.rate,
                300,
                lambda _: None,
                prelude,
            )
            print(
                f"round {r} {name:36s} p50 {got.p50_s:.2f} s  p90 {got.p90_s:.2f} s  "
                f"p99 {got.p99_s:.2f} s  max {got.max_s:.2f} s",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
