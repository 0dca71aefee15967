"""``tokens`` rows on the real broker, through kill -9: a foreign producer (raw
aiokafka, hand-built JSON) sends llm_call episodes with prompt deltas and breaks;
the worker is killed mid-stream and restarted; every row in the files equals what
a reference built here from the calls' full prompts says, exactly once, and each
sealed file's manifest line carries the weight versions of its rows; the folder
loads with ``datasets.load_dataset(<folder>)`` as one typed dataset."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from stream_export.kafka import topics
from stream_export.output.follow import Follower
from stream_export.output.layout import open_sealed, read_manifest
from stream_export.rows import schema
from stream_export.settings import Settings
from tests.support.hf_datasets import load_folder
from tests.support.processes import Worker
from tests.support.producer import produce
from tests.support.sinkfiles import all_lines
from tests.support.token_calls import Row, reference
from tests.support.typed_rows import conform_row
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

PER_ROUND = 600
KILLS = 3
NOW = time.time()


def conversation(rng: random.Random) -> list[dict[str, Any]]:
    """An episode's calls as the agent saw them: full prompt, completion, version."""
    calls: list[dict[str, Any]] = []
    for _ in range(rng.randint(1, 6)):
        prev = calls[-1] if calls else None
        tool = [rng.randrange(1000) for _ in range(rng.randint(0, 5))]
        if prev is not None and rng.random() < 0.8:  # continues: tool output appended
            prompt = prev["prompt"] + prev["completion"] + tool
        else:  # a fresh or re-rendered history
            prompt = [rng.randrange(1000) for _ in range(rng.randint(1, 12))]
        completion = [rng.randrange(1000) for _ in range(rng.randint(1, 8))]
        logprobs = [-round(rng.uniform(0, 9), 6) for _ in completion]
        version = rng.randint(1, 4)
        calls.append({"prompt": prompt, "completion": completion, "lp": logprobs, "v": version})
    return calls


def events(eid: str, calls: list[dict[str, Any]]) -> list[bytes]:
    """The episode as hand-built JSON: a call that continues the previous one is sent
    as a delta against it (only the ids it adds)."""
    out = [{"type": "start", "episode_id": eid, "time": NOW, "agent_id": "a", "prompt": "p"}]
    for seq, c in enumerate(calls):
        sent, base = c["prompt"], None
        if seq:
            done = calls[seq - 1]["prompt"] + calls[seq - 1]["completion"]
            if sent[: len(done)] == done:
                sent, base = sent[len(done) :], seq - 1
        call = {
            "request": {"messages": [{"role": "user", "content": f"turn {seq}"}]},
            "response": {"content": f"answer {seq}"},
            "prompt_token_ids": sent,
            "completion_token_ids": c["completion"],
            "logprobs": c["lp"],
            "model": "tiny",
            "weight_version": c["v"],
            "finish_reason": "stop",
            "request_id": f"{eid}-{seq}",
        }
        if base is not None:
            call["prompt_base"] = base
        step = {"type": "step", "v": 1, "episode_id": eid, "time": NOW + seq + 1, "seq": seq}
        out.append({**step, "kind": "llm_call", "call": call})
    end = {"type": "end", "episode_id": eid, "time": NOW + 9, "steps": len(calls)}
    out.append({**end, "outcome": "success", "reward": float(len(calls))})
    return [json.dumps(e).encode() for e in out]


def row_key(row: Row) -> tuple[str, int]:
    return row["episode_id"], row["segment"]


def rows_written(out: Path) -> int:
    """The committed rows under ``out`` (read as ``stream-export follow`` reads them)."""
    return sum(1 for _ in Follower(out, "training-data", wait=False)) if out.exists() else 0


def test_tokens_rows_through_kill9_equal_the_reference_exactly_once(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for(
        "format.format=tokens",
        "sink.rotate_records=53",
        "sink.flush_interval_ms=20",
        "worker.worker_id=tok-w",
    )
    out = Path(settings.sink.output_dir)
    rng = random.Random(26)
    expected: dict[tuple[str, int], Row] = {}
    asyncio.run(topics.ensure(settings))
    workers: list[Worker] = []
    cut_short: list[bool] = []  # per kill: whether the round's rows were not all out
    try:
        for round_ in range(KILLS + 1):
            # each round's episodes are sent before its worker starts: a backlog
            # the worker is killed in the middle of
            messages: list[tuple[bytes, bytes]] = []
            for i in range(round_ * PER_ROUND, (round_ + 1) * PER_ROUND):
                eid = f"ep-{i}"
                calls = conversation(rng)
                expected.update({(eid, r["segment"]): r for r in reference(eid, calls)})
                sent = events(eid, calls)
                if rng.random() < 0.1:  # a producer retry: one event twice
                    sent.insert(rng.randrange(len(sent)), rng.choice(sent[1:-1]))
                messages += [(eid.encode(), value) for value in sent]
            bootstrap = settings.kafka.bootstrap_servers
            asyncio.run(produce(bootstrap, settings.topics.steps, messages))
            before = rows_written(out)
            workers.append(Worker(settings, tmp_path / f"worker-{round_}.log").start())
            if round_ == KILLS:
                break
            wait_for(
                partial(lambda n: rows_written(out) > n, before),
                timeout=90,
                interval=0.02,
                what=f"round {round_} to write\n{workers[-1].log()[-3000:]}",
            )
            time.sleep(rng.uniform(0.0, 0.05))
            workers[-1].kill9()
            cut_short.append(rows_written(out) < len(expected))
        wait_for(
            lambda: rows_written(out) >= len(expected),
            timeout=120,
            what=f"{len(expected)} rows\n{workers[-1].log()[-3000:]}",
        )
        assert workers[-1].stop() == 0
    finally:
        for worker in workers:
            worker.stop()

    assert any(cut_short), "no kill -9 came mid-stream"
    got = [json.loads(line) for line in all_lines(out)]  # also checks the manifest
    keys = [(row["episode_id"], row["segment"]) for row in got]
    assert len(keys) == len(set(keys)), "a row twice"
    assert {k: row for k, row in zip(keys, got, strict=True)} == expected
    entries = read_manifest(out, "training-data")
    assert len(entries) >= 2
    for entry in entries:
        with open_sealed(out / entry.name) as fh:
            rows = [json.loads(line) for line in fh.read().splitlines()]
        low = min(r["weight_version_min"] for r in rows)
        high = max(r["weight_version_max"] for r in rows)
        assert (entry.weight_version_min, entry.weight_version_max) == (low, high)

    # the folder loads as one typed dataset (the card the worker wrote: README.md)
    loaded = load_folder(out, tmp_path)
    columns = schema.episode_schema(settings.format)
    assert columns is not None
    sealed_rows = []  # the active file is not part of it
    for entry in entries:
        with open_sealed(out / entry.name) as fh:
            sealed_rows += [conform_row(json.loads(line), columns) for line in fh]
    assert len(sealed_rows) > len(got) // 2
    assert sorted(loaded, key=row_key) == sorted(sealed_rows, key=row_key)
