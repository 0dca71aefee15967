"""Assembly on the real broker with real worker processes: disorder, kill -9, rebalance."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from bench.assemble_load import EpisodeReader, Plan, disorder, produce
from stream_export import topics
from stream_export.config import Settings
from tests.processes import Worker
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

#: Unended episodes close ~4s after the load: idle 2.5s + grace 0.5s of event
#: time, reached by the quiet-partition fallback after 1s of silence.
TIMEOUTS = (
    "assemble.idle_timeout_s=2.5",
    "assemble.grace_s=0.5",
    "assemble.quiet_partition_s=1",
    # A killed worker's partitions move to the other one after 6s.
    "worker.session_timeout_s=6",
)


@pytest.fixture
def reader(settings_for: Callable[..., Settings]) -> Iterator[Callable[[Settings], EpisodeReader]]:
    made: list[EpisodeReader] = []

    def make(settings: Settings) -> EpisodeReader:
        asyncio.run(topics.ensure(settings))
        made.append(EpisodeReader(settings.kafka.bootstrap_servers, settings.topics.episodes))
        return made[-1]

    yield make
    for r in made:
        r.close()


def start(settings: Settings, log: Path) -> Worker:
    asyncio.run(topics.ensure(settings))
    return Worker(settings, log).start()


def send(settings: Settings, plan: Plan, lo: int = 0, hi: int | None = None) -> None:
    messages = plan.messages[lo:hi]
    asyncio.run(produce(settings.kafka.bootstrap_servers, settings.topics.steps, messages))


def wait_episodes(reader: EpisodeReader, count: int, worker: Worker, timeout: float) -> None:
    def enough() -> bool:
        assert worker.alive(), worker.log()[-3000:]
        return reader.poll() >= count

    wait_for(enough, timeout=timeout, what=f"{count} episodes\n{worker.log()[-3000:]}")


def check_episodes(reader: EpisodeReader, plan: Plan) -> int:
    """Every episode is there, complete and in order or truncated by the timeout;
    repeats are identical. Returns the number of repeats."""
    assert set(reader.copies) == set(plan.ended) | set(plan.unended)
    for eid, copies in reader.copies.items():
        first = copies[0]
        assert all(copy == first for copy in copies[1:]), eid
        if eid in plan.ended:
            steps = plan.ended[eid]
            assert not first.truncated, eid
        else:
            steps = plan.unended[eid]
            assert first.truncated_reason == "timeout", eid
        assert [s.seq for s in first.steps] == list(range(steps)), eid
        assert [s.content for s in first.steps] == [f"s{i}" for i in range(steps)], eid
        assert len(first.sources) == steps + 1 + (eid in plan.ended)
    return reader.messages - len(reader.copies)


def topic_size(settings: Settings, topic: str) -> int:
    async def size() -> int:
        consumer = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers)
        await consumer.start()
        try:
            parts = [TopicPartition(topic, p) for p in range(settings.topics.partitions)]
            ends = await consumer.end_offsets(parts)
            return sum(ends.values())
        finally:
            await consumer.stop()

    return asyncio.run(size())


def summary(worker: Worker) -> dict[str, int]:
    line = re.findall(r"assemble summary: (.*)", worker.log())[-1]
    return {k: int(v) for k, v in (item.split("=") for item in line.split())}


def test_ten_thousand_disordered_episodes_come_out_exactly_once(
    settings_for: Callable[..., Settings],
    reader: Callable[[Settings], EpisodeReader],
    tmp_path: Path,
) -> None:
    settings = settings_for(*TIMEOUTS)
    plan = disorder(10_000, seed=1)
    assert plan.verdicts["duplicate"] > 1000 and plan.verdicts["late"] > 100
    assert len(plan.unended) > 300
    episodes = reader(settings)
    worker = start(settings, tmp_path / "worker.log")
    try:
        send(settings, plan)
        wait_episodes(episodes, plan.episodes, worker, timeout=150)
    finally:
        worker.stop()
    assert check_episodes(episodes, plan) == 0
    assert topic_size(settings, settings.topics.episodes) == plan.episodes
    late = plan.verdicts["late"]
    assert topic_size(settings, settings.topics.dead_letters) == late
    counters = summary(worker)
    assert counters == {
        "steps_accepted": plan.verdicts["accepted"],
        "steps_duplicate": plan.verdicts["duplicate"],
        "steps_conflicting": 0,
        "events_late": late,
        "events_replayed": 0,
        "events_invalid": 0,
        "episodes_emitted": plan.episodes,
        "episodes_timed_out": len(plan.unended),
        "episodes_truncated": len(plan.unended),
    }


def test_kill_9_in_the_middle_of_the_load_loses_no_episode(
    settings_for: Callable[..., Settings],
    reader: Callable[[Settings], EpisodeReader],
    tmp_path: Path,
) -> None:
    settings = settings_for("worker.store=rocksdb://", *TIMEOUTS)
    plan = disorder(10_000, seed=2)
    episodes = reader(settings)
    worker = start(settings, tmp_path / "worker.log")
    try:
        send(settings, plan)
        wait_episodes(episodes, plan.episodes // 3, worker, timeout=120)
        worker.kill9()
        done = len(episodes.copies)
        assert done < plan.episodes, "the worker finished before it was killed"
        worker.start()
        wait_episodes(episodes, plan.episodes, worker, timeout=150)
    finally:
        worker.stop()
    repeats = check_episodes(episodes, plan)
    counters = summary(worker)
    assert counters["events_replayed"] + counters["steps_accepted"] > 0
    print(f"killed after {done} episodes; {repeats} repeated; after restart: {counters}")


def test_a_second_worker_joins_and_the_first_is_killed(
    settings_for: Callable[..., Settings],
    reader: Callable[[Settings], EpisodeReader],
    tmp_path: Path,
) -> None:
    base = ("worker.store=rocksdb://", "topics.partitions=4", *TIMEOUTS)
    first = settings_for(*base, f"worker.data_dir={tmp_path / 'a'}", "worker.worker_id=a")
    second = settings_for(*base, f"worker.data_dir={tmp_path / 'b'}", "worker.worker_id=b")
    for name in ("steps", "episodes", "dead_letters", "partitions"):
        setattr(second.topics, name, getattr(first.topics, name))
    second.worker.app_id = first.worker.app_id
    second.sink.output_dir = str(tmp_path / "out-b")
    plan = disorder(10_000, seed=3)
    third = len(plan.messages) // 3
    episodes = reader(first)
    a = start(first, tmp_path / "a.log")
    b = Worker(second, tmp_path / "b.log")
    try:
        send(first, plan, 0, third)
        wait_episodes(episodes, 1000, a, timeout=120)
        b.start()
        wait_for(
            lambda: "rebuilt" in b.log(), timeout=60, what=f"b to get partitions\n{b.log()[-3000:]}"
        )
        send(first, plan, third, 2 * third)
        wait_episodes(episodes, 4000, b, timeout=120)
        a.kill9()
        send(first, plan, 2 * third)
        wait_episodes(episodes, plan.episodes, b, timeout=150)
    finally:
        a.stop()
        b.stop()
    repeats = check_episodes(episodes, plan)
    print(f"{repeats} repeated episodes; b: {summary(b)}")
