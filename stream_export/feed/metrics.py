"""The trainer feed's metrics, in the trainer's process (the conventions of
:mod:`stream_export.telemetry.metrics`)."""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from stream_export.telemetry.metrics import start_at_zero

#: Why the feed skipped a message (stream_export.feed.batches).
FEED_SKIPS: Final = ("late", "duplicate", "stale", "undecodable")
#: Weight lags, in versions.
LAG_BUCKETS: Final = (0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64)


class FeedMetrics:
    """The trainer feed's metrics, in the trainer's process (``Feed(registry=...)``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = self.registry = registry if registry is not None else CollectorRegistry()
        p = "stream_export_feed"
        self.items = Counter(f"{p}_items", "Items delivered to the trainer.", registry=r)
        self.acknowledged = Counter(
            f"{p}_acknowledged_items", "Items the trainer acknowledged.", registry=r
        )
        self.skipped = Counter(
            f"{p}_skipped", "Messages the feed did not deliver, by reason.", ["reason"], registry=r
        )
        self.lag = Gauge(
            f"{p}_lag_messages",
            "Messages of the feed's topic not yet acknowledged, by partition.",
            ["topic", "partition"],
            registry=r,
        )
        self.weight_lag = Histogram(
            f"{p}_weight_lag_versions",
            "Versions each delivered item's oldest weight version lags the trainer's"
            " (current_version), stale ones flagged included.",
            buckets=LAG_BUCKETS,
            registry=r,
        )
        start_at_zero(self, {"skipped": tuple((reason,) for reason in FEED_SKIPS)})
