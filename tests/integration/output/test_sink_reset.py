"""A topic reset under kept offsets: the episodes topic deleted and created again on the
shared broker, and a whole broker wiped under a worker's RocksDB state. By default
the worker stops with one line saying what to do; with sink.on_topic_reset=new_epoch
it seals the old files and writes every new episode exactly once."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.errors import KafkaError

from stream_export.kafka import topic_ids, topics
from stream_export.output.follow import Follower
from stream_export.output.layout import read_checkpoint, read_manifest
from stream_export.settings import Settings
from tests.support.own_broker import Broker, running
from tests.support.processes import Worker
from tests.support.producer import produce
from tests.support.sinkkafka import episode, message, prompts, publish
from tests.support.traffic import disorder
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

PREFIX = "training-data"


def stopped_on_reset(settings: Settings, log: Path) -> str:
    """Run a worker that must stop by itself on the reset; return its log."""
    worker = Worker(settings, log).start()
    try:
        wait_for(lambda: not worker.alive(), timeout=90, what=f"the worker to stop\n{worker.log()}")
    finally:
        code = worker.stop()
    text = worker.log()
    assert code == 2, text
    lines = [line for line in text.splitlines() if " ERROR stream_export" in line]
    assert len(lines) == 1 and "topic_reset:" in lines[0], text
    assert "sink.on_topic_reset=new_epoch" in lines[0]
    assert "Traceback" not in text and "ConsistencyError" not in text, text
    return lines[0]


def recreate(settings: Settings, topic: str) -> None:
    """Delete ``topic`` and create it again (a new topic id) once Kafka lets us."""

    async def delete() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
        await admin.start()
        try:
            await admin.delete_topics([topic])
        finally:
            await admin.close()

    async def created() -> bool:
        try:
            await topics.ensure(settings)
        except KafkaError:
            return False  # still being deleted
        ids = await topic_ids.fetch(settings, [topic])
        return bool(ids and topic in ids)

    asyncio.run(delete())
    wait_for(lambda: asyncio.run(created()), timeout=60, interval=0.2, what=f"{topic} again")


def test_a_recreated_episodes_topic_stops_the_worker_then_a_new_epoch_writes_it(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for()
    out = Path(settings.sink.output_dir)
    topic = settings.topics.episodes
    publish(settings, [message(episode(i)) for i in range(40)])
    old = Counter(f"task {i}" for i in range(40))
    with Worker(settings, tmp_path / "w1.log") as worker:
        wait_for(lambda: prompts(out) == old, timeout=60, what=f"40 records\n{worker.log()}")
    before = read_checkpoint(out, PREFIX)
    assert before is not None and before.topic_id is not None and before.epoch == 0

    recreate(settings, topic)
    # More records than the checkpoint's offsets: only the topic id tells the reset.
    publish(settings, [message(episode(i)) for i in range(1000, 1100)])
    new_id = asyncio.run(topic_ids.fetch(settings, [topic]))
    assert new_id is not None and new_id[topic] != before.topic_id

    line = stopped_on_reset(settings, tmp_path / "w2.log")
    assert f"topic id changed from {before.topic_id} to {new_id[topic]}" in line
    assert prompts(out) == old  # nothing written
    assert read_checkpoint(out, PREFIX) == before

    epoch = settings_for("sink.on_topic_reset=new_epoch")
    expected = old + Counter(f"task {i}" for i in range(1000, 1100))
    with Worker(epoch, tmp_path / "w3.log") as worker:
        wait_for(lambda: prompts(out) == expected, timeout=60, what=f"140 once\n{worker.log()}")
    assert "starting epoch 1" in worker.log() or "as epoch 1" in worker.log()
    ckpt = read_checkpoint(out, PREFIX)
    assert ckpt is not None
    assert (ckpt.epoch, ckpt.topic_id) == (1, new_id[topic])
    assert ckpt.epoch_reason is not None and "topic id changed" in ckpt.epoch_reason
    [sealed] = read_manifest(out, PREFIX)
    assert (sealed.reason, sealed.epoch, sealed.topic_id) == ("topic_reset", 0, before.topic_id)
    assert sealed.records == 40


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    yield from running(tmp_path / "kafka")


def episode_ids(out: Path) -> Counter[str]:
    return Counter(json.loads(line)["episode_id"] for line in Follower(out, PREFIX, wait=False))


def test_a_wiped_broker_under_rocksdb_state_stops_clearly_then_a_new_epoch_goes_on(
    settings_for: Callable[..., Settings], broker: Broker, tmp_path: Path
) -> None:
    base = (
        f"kafka.bootstrap_servers={broker.address}",
        "worker.store=rocksdb://",
        "format.format=episode",
        # Unended episodes stay open (in RocksDB) until the broker is wiped.
        "assemble.idle_timeout_s=600",
    )
    settings = settings_for(*base)
    out = Path(settings.sink.output_dir)
    bootstrap = settings.kafka.bootstrap_servers
    first = disorder(300, seed=1, unended=0.1)
    asyncio.run(topics.ensure(settings))
    asyncio.run(produce(bootstrap, settings.topics.steps, first.messages))
    with Worker(settings, tmp_path / "w1.log") as worker:
        wait_for(
            lambda: set(episode_ids(out)) == set(first.ended),
            timeout=120,
            what=f"300 episodes\n{worker.log()[-3000:]}",
        )
    assert any((tmp_path / "state").rglob("*.db")), "no RocksDB state was left"

    broker.wipe()
    second = disorder(100, seed=2, unended=0)
    asyncio.run(topics.ensure(settings))
    asyncio.run(produce(bootstrap, settings.topics.steps, second.messages))

    # A fresh sink output, so that the assembler's check is the one that stops it.
    other = settings_for(*base, f"sink.output_dir={tmp_path / 'other'}")
    line = stopped_on_reset(other, tmp_path / "w2.log")
    assert "the local table state in" in line and "changelog" in line
    assert not episode_ids(tmp_path / "other")
    assert set(episode_ids(out)) == set(first.ended)

    epoch = settings_for(*base, "sink.on_topic_reset=new_epoch")
    expected = Counter([*first.ended, *second.ended])
    with Worker(epoch, tmp_path / "w3.log") as worker:
        wait_for(
            lambda: episode_ids(out) == expected,
            timeout=120,
            what=f"all 400 episodes once\n{worker.log()[-3000:]}",
        )
    text = worker.log()
    assert "Traceback" not in text and "ConsistencyError" not in text, text
    assert f"({len(first.unended)} open episodes lost)" in text
    ckpt = read_checkpoint(out, PREFIX)
    assert ckpt is not None and ckpt.epoch == 1


@pytest.mark.parametrize("new", [20, 100])
def test_an_episodes_topic_recreated_under_a_running_worker_starts_a_new_epoch(
    settings_for: Callable[..., Settings], tmp_path: Path, new: int
) -> None:
    settings = settings_for("sink.on_topic_reset=new_epoch")
    out = Path(settings.sink.output_dir)
    publish(settings, [message(episode(i)) for i in range(40)])
    expected = Counter(f"task {i}" for i in range(40))
    with Worker(settings, tmp_path / "w.log") as worker:
        wait_for(lambda: prompts(out) == expected, timeout=60, what=f"40 records\n{worker.log()}")
        recreate(settings, settings.topics.episodes)
        publish(settings, [message(episode(i)) for i in range(1000, 1000 + new)])
        expected += Counter(f"task {i}" for i in range(1000, 1000 + new))
        wait_for(lambda: prompts(out) == expected, timeout=90, what=f"all once\n{worker.log()}")
    ckpt = read_checkpoint(out, PREFIX)
    assert ckpt is not None and ckpt.epoch == 1
