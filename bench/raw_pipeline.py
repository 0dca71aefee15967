"""The hand-written baseline: one aiokafka getmany loop doing the worker's whole job.

    python -m bench.raw_pipeline OUT.jsonl --set section.field=value ...

Per fetched batch and partition it decodes and assembles with the same pure
code the worker runs (``assemble.state.receive``, ``PartitionState``,
``build_episode``), formats with ``formats.build``, keeps the state in two
dicts shaped like the worker's tables (chunks, closed markers), appends the
lines to OUT, then commits the offsets. No Faust, no dead-letter topic, no
checkpoint: the floor of what the job costs in Python. Runs until stopped.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from bench.getmany import lines_to_file
from stream_export.assemble.chunks import ChunkKey
from stream_export.assemble.episode import Finished, build_episode
from stream_export.assemble.state import PartitionState, receive
from stream_export.output import formatter
from stream_export.runtime.metrics import Metrics
from stream_export.settings import Settings, load


class DictStore:
    """The two tables as dicts: chunks of open episodes, markers of closed ones."""

    def __init__(self) -> None:
        self.chunks: dict[ChunkKey, bytes] = {}
        self.markers: dict[bytes, bytes] = {}

    def chunk(self, key: ChunkKey) -> bytes | None:
        return self.chunks.get(key)

    def marker(self, key: bytes) -> bytes | None:
        return self.markers.get(key)

    def persist(self, state: PartitionState, finished: list[Finished], window_s: float) -> None:
        """What the worker persists after a batch: markers, deletes, new chunks."""
        for item in finished:
            self.markers[item.episode.key] = state.marker(item.episode)
        for item in finished:
            for key in state.forget(item.episode):
                self.chunks.pop(key, None)
        for key in state.garbage:
            self.chunks.pop(key, None)
        state.garbage.clear()
        now = time.time()
        start = now - now % window_s
        self.chunks.update(state.flush((start, start + window_s)))


async def run(settings: Settings, out: Path) -> None:
    consumer = AIOKafkaConsumer(
        settings.topics.steps,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        group_id=settings.worker.app_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    format_episode = formatter.build(settings.format, Metrics())
    store = DictStore()
    states: dict[int, PartitionState] = {}
    window_s = settings.assemble.window_s

    def lines_of(p: int, records: Sequence[Any]) -> list[bytes]:
        state = states.get(p)
        if state is None:
            state = states[p] = PartitionState(p, settings.assemble, store)
        wall = time.time()
        for record in records:
            receive(state, record.key, record.value, record.offset, wall)
        state.sweep()
        finished = state.take_finished()
        lines: list[bytes] = []
        for item in finished:
            episode = build_episode(p, item)
            if episode is not None:
                lines += format_episode(episode)
        store.persist(state, finished, window_s)
        return lines

    await lines_to_file(consumer, out, lines_of)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.raw_pipeline", description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    args = p.parse_args()
    asyncio.run(run(load(env={}, overrides=args.set), args.out))


if __name__ == "__main__":
    main()
