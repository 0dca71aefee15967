"""The live loop, end to end, as docs/live-loop.md runs it: `stream-export learn`
(agents on the official OpenAI SDK; the reference trainer in the trainers
environment) through a real gateway with the weight fence, to the session's own vLLM
in dev mode, with a real worker closing groups. The tiny model learns the toy task
(reward 1 when a digit is among the first four completion tokens) while the trainer,
the worker and the gateway are each killed with -9 once."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from stream_export.contract.decoding import decode_event
from stream_export.contract.events import Step
from stream_export.contract.groups import GroupRecord
from stream_export.contract.topics import topic_names
from stream_export.kafka import topics
from stream_export.settings import Settings
from tests.support.gateway_agent import base
from tests.support.monitoring import free_port, get
from tests.support.processes import Gateway, Worker, dev_tool, settings_args
from tests.support.topic_reader import committed_offsets, end_offsets, read_topic
from tests.support.vllm_server import VllmServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

GROUPS_PER_STEP, GROUP_SIZE, MAX_FEED_LAG = 4, 8, 4
#: docs/live-loop.md's bound: ceil((max_feed_lag + groups per step) / groups per step).
STALENESS_BOUND = math.ceil((MAX_FEED_LAG + GROUPS_PER_STEP) / GROUPS_PER_STEP)


def ledger(state: Path) -> list[dict[str, Any]]:
    path = state / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def version(state: Path) -> int:
    entries = ledger(state)
    return int(entries[-1]["version"]) if entries else 0


@pytest.mark.timeout(600)  # the loop alone may take 300 s on a loaded machine
def test_the_live_loop_learns_while_the_trainer_the_worker_and_a_gateway_are_killed(
    settings_for: Any, reloadable_vllm: VllmServer, unique: Any, tmp_path: Path
) -> None:
    trainers = dev_tool("trainers", "paths", timeout=60)
    assert trainers.returncode == 0, trainers.stderr
    feed_group = unique("trainer")
    settings: Settings = settings_for(
        "groups.enabled=true",
        "weights.enabled=true",
        f"weights.control_topic={unique('weights')}",
        "weights.lease_s=2",
        f"gateway.upstreams={reloadable_vllm.url}/v1",
        f"gateway.port={free_port()}",
        f"gateway.state_dir={tmp_path / 'gateway'}",
        f"gateway.feed_group={feed_group}",
        f"gateway.max_feed_lag={MAX_FEED_LAG}",
        "gateway.retry_after_s=1",
        "sink.flush_interval_ms=20",
    )
    asyncio.run(topics.ensure(settings))
    state = tmp_path / "learn"
    command = [
        sys.executable, "-m", "stream_export", "learn",
        "--model", str(reloadable_vllm.model_dir), "--vllm", reloadable_vllm.url,
        "--state-dir", str(state), "--feed-group", feed_group,
        "--groups-per-step", str(GROUPS_PER_STEP), "--group-size", str(GROUP_SIZE),
        "--trainer-python", json.loads(trainers.stdout)["trainers"], "--seed", "1",
        *settings_args(settings),
    ]  # fmt: skip
    worker = Worker(settings, tmp_path / "worker.log").start()
    gateway = Gateway(settings, tmp_path / "gateway.log").start()
    out = (tmp_path / "learn.out").open("wb")
    learn = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def logs() -> str:
        tail = (state / "trainer.log").read_text(errors="replace")[-3000:]
        return f"{(tmp_path / 'learn.out').read_text()[-3000:]}\ntrainer:\n{tail}"

    def reached(v: int) -> int:
        return wait_for(
            lambda: version(state) >= v or learn.poll() is not None,
            timeout=120,
            what=lambda: f"version {v}\n{logs()}",
        ) and version(state)

    try:
        wait_for(lambda: get(base(settings) + "/healthz")[0] == 200, timeout=60, what="gateway")
        # the trainer, mid-loop: the command restarts it from its last checkpoint
        at = reached(2)
        os.kill(int((state / "trainer.pid").read_text()), signal.SIGKILL)
        at = reached(at + 2)
        worker.kill9()
        worker = Worker(settings, tmp_path / "worker.log").start()
        at = reached(at + 2)
        gateway.kill9()
        gateway = Gateway(settings, tmp_path / "gateway.log").start()
        assert learn.wait(timeout=300) == 0, logs()
    finally:
        if learn.poll() is None:
            learn.kill()
        learn.wait()
        out.close()
        worker.stop()
        gateway.stop()
    assert "restarting" in logs()

    # learning: the rollouts of version 0 (the model as built) against the last one's
    curve = [json.loads(line) for line in logs().splitlines() if line.startswith('{"version"')]
    print("mean reward by serving version:", curve, file=sys.stderr)
    # the loop's end: the newest version with a step's worth of rollouts (the last
    # version may have served a few before the trainer stopped)
    first = curve[0]
    last = [c for c in curve if c["rollouts"] >= GROUPS_PER_STEP * GROUP_SIZE][-1]
    assert first["version"] == 0 and first["rollouts"] >= 32 and first["mean_reward"] <= 0.2
    assert last["rollouts"] >= 32 and last["mean_reward"] >= 0.8
    entries = ledger(state)
    final = entries[-1]["version"]
    staleness = [e["staleness"] for e in entries if e["stepped"]]
    assert max(staleness) <= STALENESS_BOUND, staleness

    # every call recorded with the integer version that served it, one the trainer loaded
    steps = read_topic(settings.kafka.bootstrap_servers, settings.topics.steps, count=1, timeout=30)
    events = [decode_event(r.value) for r in steps if r.value]  # markers have no value
    calls = [e.call for e in events if isinstance(e, Step) and e.call is not None]
    served = Counter(call.weight_version for call in calls)
    assert set(served) <= set(range(final + 1)), served

    # no rollout lost, none trained twice: each group record on the topic before the
    # feed's acknowledgement is in the ledger exactly once, and the ledger holds no other
    groups_topic = topic_names(settings.worker.app_id)[1]
    ends = end_offsets(settings.kafka.bootstrap_servers, groups_topic, settings.topics.partitions)
    records = read_topic(
        settings.kafka.bootstrap_servers, groups_topic, count=sum(ends.values()), timeout=30
    )
    acked = committed_offsets(settings.kafka.bootstrap_servers, feed_group, groups_topic)
    published = {msgspec.json.decode(r.value, type=GroupRecord).record_id for r in records}
    before_ack = {
        msgspec.json.decode(r.value, type=GroupRecord).record_id
        for r in records
        if r.offset < acked.get(r.partition, 0)
    }
    trained = Counter(rid for e in entries for rid in e["records"])
    assert max(trained.values()) == 1
    assert set(trained) <= published
    assert before_ack <= set(trained), before_ack - set(trained)
