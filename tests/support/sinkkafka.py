"""Helpers for sink integration tests: publish episodes, read back the output."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

from stream_export.contract.decoding import encode
from stream_export.contract.episode import Episode
from stream_export.contract.events import Step
from stream_export.kafka import topics
from stream_export.output.follow import Follower
from stream_export.settings import Settings
from tests.support.producer import produce


def episode(i: int, *, end_time: float = 1_700_000_000.0, **fields: object) -> Episode:
    """A small finished episode whose text record has the unique prompt ``task i``."""
    steps = [
        Step(episode_id=f"ep-{i}", time=end_time, seq=0, kind="thought", content="think"),
        Step(episode_id=f"ep-{i}", time=end_time, seq=1, kind="action", content=f"answer {i}"),
    ]
    return Episode(
        episode_id=f"ep-{i}",
        agent_id="agent",
        prompt=f"task {i}",
        steps=steps,
        start_time=end_time - 1,
        end_time=end_time,
        outcome="success",
        **fields,  # type: ignore[arg-type]
    )


def publish(settings: Settings, messages: list[tuple[bytes, bytes]]) -> None:
    """Send (key, value) pairs to the episodes topic, creating the topics first."""
    asyncio.run(topics.ensure(settings))
    asyncio.run(produce(settings.kafka.bootstrap_servers, settings.topics.episodes, messages))


def message(e: Episode) -> tuple[bytes, bytes]:
    return e.episode_id.encode(), encode(e)


def prompts(out: Path, prefix: str = "training-data") -> Counter[str]:
    """How often each prompt appears among the committed records under ``out``."""
    return Counter(json.loads(line)["prompt"] for line in Follower(out, prefix, wait=False))
