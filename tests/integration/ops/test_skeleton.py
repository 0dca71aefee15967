"""The walking skeleton end to end on a real broker: demo agents -> worker -> JSONL."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import pytest

from stream_export.kafka import topics
from stream_export.ops import demo
from stream_export.settings import Settings
from tests.support.processes import Worker
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

#: Faust's table manager slept a fixed second here on every start (patches.tables).
TABLES_WAITED = "Waiting for tables to be registered"
TABLES_START = "OpenTable: assemble-open]: Starting"


def logged_at(log: str, text: str) -> datetime:
    """When the first log line holding ``text`` was written."""
    line = next(line for line in log.splitlines() if text in line)
    return datetime.fromisoformat(line.split(" ", 1)[0])


def test_demo_episodes_become_prompt_completion_lines(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for()
    asyncio.run(topics.ensure(settings))
    out = Path(settings.sink.output_dir) / "training-data.jsonl"
    with Worker(settings, tmp_path / "worker.log") as worker:
        sent = asyncio.run(
            demo.run(
                settings.kafka.bootstrap_servers, settings.topics.steps, rate=0, count=25, seed=7
            )
        )
        assert sent == 25

        def lines() -> list[str]:
            if not out.exists():
                return []
            got = out.read_text().splitlines()
            return got if len(got) >= 25 else []

        got = wait_for(lines, timeout=90, what=f"25 lines in {out}\n{worker.log()[-3000:]}")
    log = worker.log()
    # The tables start as soon as they are registered, not a fixed second later.
    waited = logged_at(log, TABLES_START) - logged_at(log, TABLES_WAITED)
    assert waited.total_seconds() < 0.5, waited
    records = [json.loads(line) for line in got]
    assert len(records) == 25
    for record in records:
        assert isinstance(record["prompt"], str) and record["prompt"]
        assert isinstance(record["completion"], str) and "Action: " in record["completion"]
