"""The token benchmark's baseline, ``python -m bench.raw_tokens``, on the real broker,
reading a steps topic that holds a worker's control ticks (empty values with the
control header) between the events, as every steps topic a worker ran on does: it
skips them and writes every episode's row (it used to die on the first tick with
``msgspec.DecodeError: Input data was truncated``, so the benchmark could not
finish its rounds)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from stream_export.kafka import topics
from stream_export.runtime.stage import CONTROL_HEADER, TICK
from stream_export.settings import Settings
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

NOW = time.time()
EPISODES = 3


def events(eid: str) -> list[bytes]:
    """An episode of one model call, as an agent sends it."""
    call = {
        "request": {"messages": [{"role": "user", "content": "hi"}]},
        "response": {"content": "yo"},
        "prompt_token_ids": [1, 2, 3],
        "completion_token_ids": [4, 5],
        "logprobs": [-0.5, -0.25],
        "model": "tiny",
        "weight_version": 1,
        "finish_reason": "stop",
        "request_id": f"{eid}-0",
    }
    step = {"type": "step", "episode_id": eid, "time": NOW, "seq": 0, "kind": "llm_call"}
    return [
        json.dumps(e).encode()
        for e in (
            {"type": "start", "episode_id": eid, "time": NOW, "agent_id": "a", "prompt": "p"},
            {**step, "call": call},
            {"type": "end", "episode_id": eid, "time": NOW, "steps": 1, "outcome": "success"},
        )
    ]


async def send(bootstrap: str, topic: str) -> None:
    """Each episode's events, a tick to every partition before each of them."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for i in range(EPISODES):
            for value in events(f"ep-{i}"):
                for partition in (0, 1):  # as the worker's runner sends a tick
                    await producer.send_and_wait(
                        topic, b"", key=b"", partition=partition, headers=[(CONTROL_HEADER, TICK)]
                    )
                await producer.send_and_wait(topic, value, key=f"ep-{i}".encode())
    finally:
        await producer.stop()


def test_the_raw_token_pipeline_skips_control_ticks(
    settings_for: Callable[..., Settings], unique: Callable[[str], str], tmp_path: Path
) -> None:
    settings = settings_for()
    asyncio.run(topics.ensure(settings))
    bootstrap, topic = settings.kafka.bootstrap_servers, settings.topics.steps
    asyncio.run(send(bootstrap, topic))
    out, log = tmp_path / "raw.jsonl", tmp_path / "raw.log"
    command = [sys.executable, "-m", "bench.raw_tokens", str(out), "--bootstrap", bootstrap]
    command += ["--topic", topic, "--group", unique("raw")]
    with log.open("wb") as err:
        raw = subprocess.Popen(command, stderr=err)
    try:

        def rows() -> int:
            assert raw.poll() is None, log.read_text()[-3000:]
            return len(out.read_bytes().splitlines()) if out.exists() else 0

        wait_for(lambda: rows() == EPISODES, timeout=60, what=lambda: log.read_text()[-3000:])
    finally:
        raw.terminate()
        raw.wait(10)
    got = sorted(json.loads(line)["episode_id"] for line in out.read_bytes().splitlines())
    assert got == [f"ep-{i}" for i in range(EPISODES)]
