"""What the operations endpoints cost the worker: one /metrics scrape, one
status-page refresh, one throughput sample, with realistic label sets.

    python -m bench.ops_overhead

Prints microseconds per call and the share of one core each takes at its
default rate (scrape every 15 s, the page polling every 2 s, sampling every 1 s),
next to the per-event budget of a bare Faust agent (~12k events/s, design notes).
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from prometheus_client import generate_latest

from stream_export.ops import status
from stream_export.runtime.metrics import Metrics

FAUST_EVENTS_PER_S = 12_000


def loaded_metrics(partitions: int = 16) -> Metrics:
    m = Metrics()
    rng = random.Random(1)
    for kind in ("start", "step", "end"):
        m.events_consumed.labels(kind).inc(rng.randrange(10**6))
    for reason in ("not_json", "invalid", "too_large", "unknown_type"):
        m.events_invalid.labels(reason).inc(3)
        m.dead_letters.labels(reason).inc(3)
    for outcome in ("success", "failure", "timeout"):
        m.episodes_emitted.labels(outcome).inc(1000)
    for p in range(partitions):
        m.open_episodes.labels(str(p)).set(rng.randrange(500))
        for topic in ("agent-steps", "agent-episodes"):
            m.consumer_lag.labels(topic, str(p)).set(rng.randrange(100))
    for _ in range(10_000):
        m.end_to_end_seconds.observe(rng.random())
        m.write_seconds.observe(rng.random() / 100)
        m.episode_steps.observe(rng.randrange(1, 200))
    m.records_written.inc(10**6)
    return m


def per_call_us(fn: Callable[[], object], seconds: float = 1.0) -> float:
    calls, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        fn()
        calls += 1
    return (time.perf_counter() - began) / calls * 1e6


def main() -> None:
    m = loaded_metrics()
    r = m.registry
    throughput = status.Throughput(r)

    def status_numbers() -> None:
        samples = status.collect(r, status.STATUS_FAMILIES)
        for name in status.STATUS_FAMILIES:
            status.total(samples, name)
            status.by_label(samples, name + "_total", "reason")

    exposition = generate_latest(r)
    lines = len(exposition.splitlines())
    print(f"/metrics body: {len(exposition)} bytes, {lines} lines")
    print(f"per-event budget of a bare Faust agent: {1e6 / FAUST_EVENTS_PER_S:.0f} us")
    for what, fn, every_s in (
        ("/metrics scrape", lambda: generate_latest(r), 15.0),
        ("status page refresh (numbers)", status_numbers, 2.0),
        ("throughput sample", throughput.sample, 1.0),
    ):
        us = per_call_us(fn)
        share = us / (every_s * 1e6)
        events = share * FAUST_EVENTS_PER_S
        print(
            f"{what:32s} {us:9.0f} us/call  every {every_s:4.0f} s -> {share:7.3%} of a core"
            f"  (~{events:.1f} events/s of Faust throughput)"
        )


if __name__ == "__main__":
    main()
