"""Dead letters: the original bytes of a rejected message, with why and where from.

Every stage that rejects input (bad step events, conflicting or late events,
formatter failures) sends it here, so nothing disappears silently. Headers:

    x-reason      machine-readable reason (also the metric label)
    x-detail      human-readable explanation
    x-source      source topic / partition / offset, as "topic/partition/offset"
    x-stage       which stage rejected it (decode, assemble, format, sink)
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

from stream_export.errors import StreamExportError
from stream_export.runtime.metrics import Metrics

MAX_DETAIL = 1000


@dataclass(frozen=True)
class Source:
    topic: str
    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition}/{self.offset}"


def headers(error: StreamExportError, source: Source, stage: str) -> list[tuple[str, bytes]]:
    return [
        ("x-reason", error.reason.encode()),
        ("x-detail", error.detail[:MAX_DETAIL].encode("utf-8", "replace")),
        ("x-source", str(source).encode()),
        ("x-stage", stage.encode()),
    ]


async def send(
    topic: Any,
    metrics: Metrics,
    *,
    key: bytes | None,
    value: bytes | None,
    error: StreamExportError,
    source: Source,
    stage: str,
) -> Awaitable[Any]:
    """Send ``value`` unchanged to the dead-letter ``topic`` (a Faust topic) and count
    it; returns the broker's acknowledgement to await (the send only buffers it)."""
    acknowledged: Awaitable[Any] = await topic.send(
        key=key, value=value, headers=headers(error, source, stage)
    )
    metrics.dead_letters.labels(error.reason).inc()
    return acknowledged
