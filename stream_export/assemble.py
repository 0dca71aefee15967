"""Assemble step events into finished episodes (walking skeleton).

Skeleton: keeps each open episode's raw events in a Faust table and emits the
episode when its end event arrives. The full version (ordering, duplicates,
timeouts, linear state) replaces this module.
"""

from __future__ import annotations

from typing import Any

import faust
import msgspec

from stream_export import dlq
from stream_export.app import Topics
from stream_export.config import Settings
from stream_export.errors import DecodeError
from stream_export.events import Episode, EpisodeEnd, EpisodeStart, Step, decode_event, encode
from stream_export.metrics import Metrics


def build_episode(start: EpisodeStart, steps: list[Step], end: EpisodeEnd) -> Episode:
    return Episode(
        episode_id=start.episode_id,
        agent_id=start.agent_id,
        prompt=start.prompt,
        steps=sorted(steps, key=lambda s: s.seq),
        start_time=start.time,
        end_time=end.time,
        outcome=end.outcome,
        group_id=start.group_id,
        reward=end.reward,
        metadata={**start.metadata, **end.metadata},
    )


def attach(app: faust.App, topics: Topics, settings: Settings, metrics: Metrics) -> None:
    table = app.Table(
        "open-episodes",
        default=list,
        schema=faust.Schema(key_type=bytes, key_serializer="raw", value_serializer="json"),
    )

    @app.agent(topics.steps, name="assemble")
    async def assemble(stream: Any) -> None:
        async for event_in in stream.events():
            key, value, msg = event_in.key, event_in.value, event_in.message
            try:
                event = decode_event(value, max_bytes=settings.assemble.max_event_bytes)
            except DecodeError as exc:
                metrics.events_invalid.labels(exc.reason).inc()
                source = dlq.Source(msg.topic, msg.partition, msg.offset)
                await dlq.send(
                    topics.dead_letters,
                    metrics,
                    key=key,
                    value=value,
                    error=exc,
                    source=source,
                    stage="decode",
                )
                continue
            metrics.events_consumed.labels(event.__struct_config__.tag).inc()
            raw = table[key] + [msgspec.json.decode(value)]
            if not isinstance(event, EpisodeEnd):
                table[key] = raw
                continue
            events = [decode_event(msgspec.json.encode(e)) for e in raw]
            start = next(e for e in events if isinstance(e, EpisodeStart))
            steps = [e for e in events if isinstance(e, Step)]
            episode = build_episode(start, steps, event)
            await topics.episodes.send(key=key, value=encode(episode))
            metrics.episodes_emitted.labels(episode.outcome).inc()
            del table[key]
