"""kill -9 the real worker at random moments while it writes; every record lands once,
in gzip-compressed JSON lines and in Parquet."""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path

import pytest

from stream_export.output.layout import read_manifest
from stream_export.settings import Settings
from tests.support.processes import Worker
from tests.support.sinkfiles import all_lines
from tests.support.sinkkafka import episode, message, prompts, publish
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

PER_ROUND = 1200


def grown(out: Path, before: int) -> bool:
    return sum(prompts(out).values()) > before


@pytest.mark.parametrize(
    ("encoding", "suffix", "kills"),
    [("sink.compression=gzip", ".jsonl.gz", 22), ("sink.encoding=parquet", ".parquet", 4)],
)
def test_kill9s_under_load_leave_every_record_exactly_once(
    settings_for: Callable[..., Settings], tmp_path: Path, encoding: str, suffix: str, kills: int
) -> None:
    settings = settings_for(
        "sink.rotate_records=97",
        "sink.flush_interval_ms=20",
        encoding,
        "worker.worker_id=crash-w",
        # Without the episode-id guard, so only the checkpoint protocol is tested.
        "sink.dedupe_window=0",
    )
    out = Path(settings.sink.output_dir)
    rng = random.Random(20)
    expected: Counter[str] = Counter()
    before = 0
    workers: list[Worker] = []
    try:
        for round_ in range(kills + 1):
            first = round_ * PER_ROUND
            batch = [message(episode(i)) for i in range(first, first + PER_ROUND)]
            batch.insert(rng.randrange(len(batch)), (b"bad", b"not an episode"))
            publish(settings, batch)
            expected.update(f"task {i}" for i in range(first, first + PER_ROUND))
            workers.append(Worker(settings, tmp_path / f"worker-{round_}.log").start())
            if round_ == kills:
                break
            # Kill at a random moment once the sink is writing this round's
            # backlog, however long the worker took to start on a loaded machine.
            wait_for(
                partial(grown, out, before),
                timeout=60,
                interval=0.02,
                what=f"round {round_} to start writing\n{workers[-1].log()[-3000:]}",
            )
            time.sleep(rng.uniform(0.0, 0.3))
            workers[-1].kill9()
            before = sum(prompts(out).values())
        total = sum(expected.values())
        wait_for(
            lambda: sum(prompts(out).values()) >= total,
            timeout=60,
            what=f"{total} records\n{workers[-1].log()[-3000:]}",
        )
        assert workers[-1].stop() == 0
    finally:
        for worker in workers:
            worker.stop()
    assert prompts(out) == expected
    records = [json.loads(line) for line in all_lines(out)]  # also checks manifest sums
    assert len(records) == total
    entries = read_manifest(out, "training-data")
    assert len(entries) >= total // 97 - 1
    assert all(e.name.endswith(f"-crash-w{suffix}") for e in entries)
