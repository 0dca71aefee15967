"""Format settings reach a real worker: per-step TRL records, filtered, on a real broker."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stream_export.contract.events import EpisodeEnd, Step
from stream_export.kafka import topics
from stream_export.ops import demo
from stream_export.rows import episode
from stream_export.settings import Settings
from tests.support.processes import Worker
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

EPISODES, SEED = 12, 11


def expected_records() -> dict[str, int]:
    """Decision count of every successful demo episode the run below sends."""
    expected = {}
    for events in itertools.islice(demo.episodes(SEED), EPISODES):
        end = next(e for e in events if isinstance(e, EpisodeEnd))
        if end.outcome == "success":
            steps = [e for e in events if isinstance(e, Step)]
            expected[end.episode_id] = len(episode.decisions(steps))
    return expected


def test_worker_writes_filtered_per_step_conversational_records(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for(
        "format.format=conversational",
        "format.granularity=step",
        "format.metadata_mode=nested",
        "format.only_success=true",
    )
    asyncio.run(topics.ensure(settings))
    expected = expected_records()
    assert 0 < len(expected) < EPISODES  # the filter has something to drop
    out = Path(settings.sink.output_dir) / "training-data.jsonl"
    with Worker(settings, tmp_path / "worker.log") as worker:
        asyncio.run(
            demo.run(
                settings.kafka.bootstrap_servers,
                settings.topics.steps,
                rate=0,
                count=EPISODES,
                seed=SEED,
            )
        )

        want = sum(expected.values())

        def records() -> list[dict[str, Any]]:
            lines = out.read_bytes().splitlines() if out.exists() else []
            return [json.loads(line) for line in lines] if len(lines) >= want else []

        got = wait_for(records, timeout=90, what=f"{want} records in {out}\n{worker.log()[-3000:]}")
    assert len(got) == want
    per_episode: dict[str, list[int]] = {}
    for record in got:
        assert record["prompt"][0]["role"] == "user"
        [message] = record["completion"]
        assert message["role"] == "assistant" and message["content"]
        assert record["metadata"]["outcome"] == "success"
        per_episode.setdefault(record["metadata"]["episode_id"], []).append(
            record["metadata"]["decision"]
        )
    assert {k: sorted(v) for k, v in per_episode.items()} == {
        k: list(range(n)) for k, n in expected.items()
    }
