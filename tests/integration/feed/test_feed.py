"""The trainer feed on the real broker: a trainer killed with -9 gets again exactly
what it did not acknowledge; in-flight bounds, staleness and the lag it exports,
which a gateway answers 429 over."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import openai
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient

from stream_export.contract.topics import topic_names
from stream_export.errors import FeedError
from stream_export.feed import Feed
from stream_export.kafka import topics
from stream_export.settings import Settings
from tests.support.call_episodes import tool_episode
from tests.support.gateway_agent import base, gateway_for, key_bound_agent, running
from tests.support.group_records import group, rollout
from tests.support.monitoring import get_json
from tests.support.processes import settings_args
from tests.support.producer import produce
from tests.support.vllm_server import VllmServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
__all__ = ["gateway_for"]  # the fixture, shared

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "trainer_feed.py"


def publish(settings: Settings, records: list[Any]) -> str:
    asyncio.run(topics.ensure(settings))
    name = topic_names(settings.worker.app_id)[1]
    messages = [(r.group_id.encode(), msgspec.json.encode(r)) for r in records]
    asyncio.run(produce(settings.kafka.bootstrap_servers, name, messages))
    return name


class Trainer:
    """examples/trainer_feed.py as a child process; its stdout read line by line."""

    def __init__(self, settings: Settings, log: Path, *args: str) -> None:
        self.log = log
        command = [sys.executable, str(EXAMPLE), *settings_args(settings), *args]
        self.proc = subprocess.Popen(command, stdout=log.open("wb"), stderr=subprocess.STDOUT)

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines()

    def batches(self) -> tuple[dict[int, list[str]], set[int]]:
        taken, acked = {}, set()
        for line in self.lines():
            word, _, rest = line.partition(" ")
            if word == "batch":
                n, _, ids = rest.partition(" ")
                taken[int(n)] = ids.split()
            elif word == "acked":
                acked.add(int(rest))
        return taken, acked


def committed_at_end(settings: Settings, topic: str, group_id: str) -> bool:
    async def check() -> bool:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
        ends = AIOKafkaConsumer(bootstrap_servers=settings.kafka.bootstrap_servers)
        await admin.start()
        await ends.start()
        try:
            parts = [TopicPartition(topic, p) for p in range(settings.topics.partitions)]
            offsets = await admin.list_consumer_group_offsets(group_id, partitions=parts)
            end = await ends.end_offsets(parts)
            return all(offsets[tp].offset == end[tp] for tp in parts)
        finally:
            await admin.close()
            await ends.stop()

    return asyncio.run(check())


def test_a_killed_trainer_gets_again_exactly_what_it_did_not_acknowledge(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for("groups.enabled=true")
    records = [group(f"g{i}", [rollout(f"{i}a", 1.0), rollout(f"{i}b", 0.0)]) for i in range(60)]
    late = group("late", [rollout("z", 1.0)], reason="late")
    topic = publish(settings, [*records[:30], late, records[3], *records[30:]])
    every = {r.record_id for r in records}

    first = Trainer(settings, tmp_path / "t1.log", "--batch-size", "4")
    try:
        wait_for(lambda: "acked 3" in first.lines(), timeout=60, what=lambda: str(first.lines()))
    finally:
        first.proc.kill()  # -9, wherever it is
        first.proc.wait()
    taken1, acked1 = first.batches()
    done1 = {i for n in acked1 for i in taken1[n]}
    open1 = [taken1[n] for n in taken1 if n not in acked1]
    assert len(open1) <= 1  # max_inflight = 1

    second = Trainer(settings, tmp_path / "t2.log", "--batch-size", "4", "--timeout", "5")
    assert second.proc.wait(timeout=120) == 0, second.lines()
    taken2, acked2 = second.batches()
    assert set(taken2) == acked2 and second.lines()[-1] == "idle"
    got2 = [i for n in sorted(taken2) for i in taken2[n]]

    assert len(got2) == len(set(got2)), "a record twice"
    assert not done1 & set(got2), "an acknowledged record came again"
    in_flight = set(open1[0]) if open1 else set()
    assert done1 | set(got2) | in_flight == every  # the late rollout and the re-emission: never
    assert committed_at_end(settings, topic, "trainer")


def test_in_flight_bound_staleness_skips_and_lag(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for("groups.enabled=true")
    fresh = [group(f"f{i}", [tool_episode(f"f{i}", versions=(9, 9))]) for i in range(6)]
    stale = group("old", [tool_episode("old", versions=(2, 3))])
    publish(settings, [stale, *fresh, fresh[0]])
    feed = Feed(
        settings,
        group_id="t",
        batch_size=2,
        max_inflight=2,
        max_weight_lag=4,
        current_version=lambda: 9,
        stale="drop",
    )
    with feed:
        one = feed.next_batch(timeout_s=30)
        two = feed.next_batch(timeout_s=30)
        with pytest.raises(FeedError, match="max_inflight=2"):
            feed.next_batch(timeout_s=30)
        two.ack()  # out of order: nothing of a partition before one's messages on it
        waiting = feed.lag()
        assert waiting >= len(one.items)
        one.ack()
        assert feed.lag() < waiting
        three = feed.next_batch(timeout_s=30)
        three.ack()
        with pytest.raises(FeedError, match="no item"):
            feed.next_batch(timeout_s=2)  # a skipped message last: committed all the same
        assert feed.lag() == 0
        delivered = [g.record_id for b in (one, two, three) for g in b.items]
        assert sorted(delivered) == sorted(r.record_id for r in fresh)
        skipped = {
            s.labels["reason"]: s.value
            for m in feed.metrics.skipped.collect()
            for s in m.samples
            if s.name.endswith("_total")
        }
        assert skipped == {"late": 0, "duplicate": 1, "stale": 1, "undecodable": 0}
    # flag (the default): the stale group is delivered, first with the oldest
    # version first, with its lag for the trainer to weight it
    flagged = Feed(
        settings,
        group_id="flag",
        batch_size=8,
        max_weight_lag=4,
        current_version=lambda: 9,
        order="oldest",
    )
    with flagged:
        batch = flagged.next_batch(timeout_s=30)
        assert batch.items[0].record_id == stale.record_id
        assert batch.lags[0] == 7 and set(batch.lags[1:]) == {0}
        lags = {s.name: s.value for m in flagged.metrics.weight_lag.collect() for s in m.samples}
        assert lags["stream_export_feed_weight_lag_versions_count"] == len(batch.items)


def test_an_ack_does_not_wait_behind_the_consumers_long_poll_fetch(
    settings_for: Callable[..., Settings],
) -> None:
    """An ack returns once its commit is done. It also asked the broker for the
    topic's end offsets, for the lag gauge, on the connection the consumer's
    long-poll fetch holds: 0.5 s an ack on an idle topic here, 0.1-0.3 s of a
    live loop's 0.5 s step."""
    settings = settings_for("groups.enabled=true")
    records = [group(f"a{i}", [tool_episode(f"a{i}", versions=(1, 1))]) for i in range(8)]
    publish(settings, records)
    seconds = []
    with Feed(settings, group_id="t", batch_size=1, max_inflight=len(records)) as feed:
        batches = [feed.next_batch(timeout_s=30) for _ in records]
        # the consumer, with nothing left to read, starts a long-poll fetch (at once;
        # the pause makes sure of it, so an ack asking on its connection waits)
        time.sleep(0.3)
        for batch in batches:
            began = time.monotonic()
            batch.ack()
            seconds.append(time.monotonic() - began)
        gauge = sum(s.value for m in feed.metrics.lag.collect() for s in m.samples)
        assert gauge == 0, "the gauge after the last ack"
        assert feed.lag() == 0
    assert statistics.median(seconds) < 0.2, seconds  # 0.5 s each before


def test_the_gateway_answers_429_while_the_trainer_lags_and_resumes_once_it_acknowledges(
    gateway_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    settings = gateway_for(
        "groups.enabled=true", "gateway.feed_group=trainer", "gateway.max_feed_lag=2"
    )
    records = [group(f"g{i}", [rollout(f"{i}a", 1.0), rollout(f"{i}b", 0.0)]) for i in range(4)]
    publish(settings, records)
    with running(settings, tmp_path / "gateway.log"):
        health = wait_for(
            lambda: (h := get_json(base(settings) + "/healthz")) and h["throttled"] and h,
            timeout=30,
            what="the gateway to see the trainer's lag",
        )
        assert health["feed_lag"] == 4 and health["consumer_lag"] is None
        _, agent = key_bound_agent(settings, vllm_server)
        with pytest.raises(openai.RateLimitError, match="the trainer lag 4 events behind"):
            agent.call(seed=1, tool_choice="none", max_tokens=2)
        with Feed(settings, group_id="trainer", batch_size=4) as feed:
            feed.next_batch(timeout_s=30).ack()
        wait_for(
            lambda: get_json(base(settings) + "/healthz")["feed_lag"] == 0,
            timeout=30,
            what="the gateway to see the trainer caught up",
        )
        agent.call(seed=1, tool_choice="none", max_tokens=2)  # admitted again


def test_a_record_published_again_after_the_trainer_restarted_is_not_delivered_again(
    settings_for: Callable[..., Settings],
) -> None:
    """A worker's re-emission can come after the trainer acknowledged the first copy
    and restarted: the restarted feed reads back what its group acknowledged (the
    look-back), so the copy is skipped there too, not only within one process."""
    settings = settings_for("groups.enabled=true", "topics.partitions=2")
    first = [group(f"g{i}", [rollout(f"g{i}", 1.0), rollout(f"h{i}", 0.0)]) for i in range(3)]
    publish(settings, first)
    with Feed(settings, group_id="t", batch_size=3) as feed:
        batch = feed.next_batch(timeout_s=30)
        assert sorted(g.record_id for g in batch.items) == sorted(r.record_id for r in first)
        batch.ack()
    later = group("g9", [rollout("g9", 1.0), rollout("h9", 0.0)])
    publish(settings, [first[1], later])
    with Feed(settings, group_id="t", batch_size=3, max_wait_s=0.5) as feed:
        batch = feed.next_batch(timeout_s=30)
        assert [g.record_id for g in batch.items] == [later.record_id]
        batch.ack()
        skipped = feed.metrics.registry.get_sample_value(
            "stream_export_feed_skipped_total", {"reason": "duplicate"}
        )
        assert skipped == 1


def test_a_deadline_reached_with_items_taken_delivers_them_as_a_short_batch(
    settings_for: Callable[..., Settings],
) -> None:
    """``timeout_s`` shorter than ``max_wait_s``: the items already taken when the
    deadline passes come as a short batch, never an error that commits past them."""
    settings = settings_for("groups.enabled=true")
    records = [group(f"s{i}", [rollout(f"{i}a", 1.0), rollout(f"{i}b", 0.0)]) for i in range(3)]
    topic = publish(settings, records)
    with Feed(settings, group_id="short", batch_size=8, max_wait_s=600) as feed:
        batch = feed.next_batch(timeout_s=5)
        assert sorted(g.record_id for g in batch.items) == sorted(r.record_id for r in records)
        assert not committed_at_end(settings, topic, "short")  # not before the ack
        batch.ack()
    assert committed_at_end(settings, topic, "short")
