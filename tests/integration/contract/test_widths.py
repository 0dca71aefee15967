"""Numbers out of their declared range on the real broker: a token id of 2^31 + 537 or
2^64 + 5, a logprob of -1e39 and a weight version of 2^63 in ``llm_call`` steps are
dead letters ``out_of_range``, the episodes around them are written, and
``datasets.load_dataset`` of the whole output folder (through the card the worker
writes) loads them typed; floats below 1e-4 come back exactly as sent."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stream_export.kafka import topics
from stream_export.output import card
from stream_export.output.layout import open_sealed, read_manifest
from stream_export.rows import schema
from stream_export.settings import Settings
from tests.support.hf_datasets import load_folder
from tests.support.processes import Worker
from tests.support.producer import produce
from tests.support.sinkfiles import all_lines
from tests.support.topic_reader import header, read_topic
from tests.support.typed_rows import conform_row
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

NOW = time.time()
GOOD = 5
#: (episode, what is out of range): each an llm_call step the decoder must refuse.
BAD: dict[str, dict[str, Any]] = {
    "bad-int32": {"prompt_token_ids": [1, 2**31 + 537]},
    "bad-uint64": {"completion_token_ids": [2**64 + 5], "logprobs": [-0.5]},
    "bad-float32": {"logprobs": [-1e39]},
    "bad-int64": {"weight_version": 2**63},
}
#: A logprob of a confident token: msgspec writes it -3.36e-6, json.dumps -3.36e-06.
TINY = -3.36e-6


def episode(eid: str, **call: Any) -> list[tuple[bytes, bytes]]:
    """One episode of a single model call, as a foreign producer spells it."""
    step = {"type": "step", "episode_id": eid, "time": NOW, "seq": 0, "kind": "llm_call"}
    fields = {
        "request": {"messages": [{"role": "user", "content": "hi"}]},
        "response": {"content": "yo"},
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "logprobs": [TINY, -0.25],
        "model": "tiny",
        "weight_version": 7,
        "finish_reason": "stop",
        "request_id": f"{eid}-0",
        **call,
    }
    events = [
        {"type": "start", "episode_id": eid, "time": NOW, "agent_id": "a", "prompt": "p"},
        {**step, "call": fields},
        {"type": "end", "episode_id": eid, "time": NOW, "steps": 1, "outcome": "success"},
    ]
    return [(eid.encode(), json.dumps(e).encode()) for e in events]


def test_out_of_range_numbers_are_dead_letters_and_the_folder_loads(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for("format.format=tokens", "sink.rotate_records=1")
    asyncio.run(topics.ensure(settings))
    out, bootstrap = Path(settings.sink.output_dir), settings.kafka.bootstrap_servers
    messages = [m for i in range(GOOD) for m in episode(f"good-{i}")]
    messages += [m for eid, call in BAD.items() for m in episode(eid, **call)]
    asyncio.run(produce(bootstrap, settings.topics.steps, messages))

    worker = Worker(settings, tmp_path / "worker.log").start()
    try:
        dead = read_topic(bootstrap, settings.topics.dead_letters, count=len(BAD), timeout=90)

        def written() -> bool:
            assert worker.alive(), worker.log()[-3000:]
            sealed = sum(e.records for e in read_manifest(out, "training-data"))
            return sealed >= GOOD - 1 and (out / card.NAME).exists()

        wait_for(written, timeout=60, what="the good rows sealed and the card")
    finally:
        assert worker.stop() == 0
    got = {(header(d, "x-reason"), header(d, "x-stage"), d.key.decode()) for d in dead}
    assert got == {("out_of_range", "decode", eid) for eid in BAD}
    rows = [json.loads(line) for line in all_lines(out)]
    assert sorted(r["episode_id"] for r in rows) == [f"good-{i}" for i in range(GOOD)]
    for row in rows:  # the tiny logprob is read back exactly
        assert row["logprobs"] == [0.0, 0.0, 0.0, TINY, -0.25]

    loaded = load_folder(out, tmp_path)
    columns = schema.episode_schema(settings.format)
    assert columns is not None
    sealed = []
    for entry in read_manifest(out, "training-data"):
        with open_sealed(out / entry.name) as fh:
            sealed += [conform_row(json.loads(line), columns) for line in fh]
    assert loaded.features["input_ids"].feature.dtype == "int32"
    assert sorted(loaded, key=lambda r: r["episode_id"]) == sorted(
        sealed, key=lambda r: r["episode_id"]
    )
