"""Append formatted records to the JSONL output (walking skeleton: one file)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import faust

from stream_export import formats
from stream_export.app import Topics
from stream_export.config import Settings
from stream_export.events import decode_episode
from stream_export.metrics import Metrics


def attach(app: faust.App, topics: Topics, settings: Settings, metrics: Metrics) -> None:
    path = Path(settings.sink.output_dir) / f"{settings.sink.prefix}.jsonl"
    format_episode = formats.build(settings.format, metrics)

    def append(line: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("ab") as out:
            out.write(line)

    @app.agent(topics.episodes, name="sink")
    async def sink(stream: Any) -> None:
        async for value in stream:
            for record in format_episode(decode_episode(value)):
                append(record + b"\n")
                metrics.records_written.inc()
                metrics.bytes_written.inc(len(record) + 1)
