"""The hand-written baselines' loop (bench/raw_pipeline.py, bench/raw_tokens.py): plain
aiokafka, no project code. Fetch, turn each partition's records into lines, append
them to a file, commit the offsets; until stopped."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer


async def lines_to_file(
    consumer: AIOKafkaConsumer, out: Path, lines_of: Callable[[int, Sequence[Any]], list[bytes]]
) -> None:
    """Start ``consumer`` and run: ``lines_of(partition, records)`` per fetched batch."""
    await consumer.start()
    try:
        with out.open("ab") as fh:
            while True:
                batches = await consumer.getmany(timeout_ms=100)
                lines: list[bytes] = []
                for tp, records in batches.items():
                    lines += lines_of(tp.partition, records)
                if lines:
                    lines.append(b"")
                    fh.write(b"\n".join(lines))
                    fh.flush()
                if batches:
                    await consumer.commit()
    finally:
        await consumer.stop()
