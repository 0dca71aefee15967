"""The metric conventions every process follows (worker, gateway, feed): shared
histogram buckets, and labelled counters created at 0 so a series exists before
its first increment (``increase(...) > 0`` then sees the first error; a series
that appears already at 1 has no increase)."""

from __future__ import annotations

from prometheus_client import Counter

LATENCY_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300)
IO_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5)


def start_at_zero(metrics: object, labels: dict[str, tuple[tuple[str, ...], ...]]) -> None:
    """Create each labelled counter's known series at 0."""
    for name, series in labels.items():
        counter: Counter = getattr(metrics, name)
        for values in series:
            counter.labels(*values)
