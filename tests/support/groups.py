"""Shared by the groups stage's integration tests: rollouts, the group records on
the groups topic, the committed rows of a group output, and reference advantages
computed independently of ``stream_export.groups.advantages``."""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from aiokafka.errors import KafkaError

from stream_export.contract.decoding import decode_record
from stream_export.contract.episode import Episode
from stream_export.contract.events import Step
from stream_export.contract.groups import GroupRecord
from stream_export.contract.topics import topic_names
from stream_export.output.follow import Follower
from stream_export.settings import Settings
from tests.support.topic_reader import read_so_far, read_topic

EPS = 1e-6
TIMEOUT_S = 60.0
#: Four partitions, quick timeouts, RocksDB state: what most groups tests run.
SETTINGS = (
    "topics.partitions=4",
    "groups.enabled=true",
    f"groups.timeout_s={TIMEOUT_S}",
    "assemble.idle_timeout_s=2.5",
    "assemble.grace_s=0.5",
    "assemble.quiet_partition_s=3",
    "assemble.persist_interval_s=0.2",
    "worker.store=rocksdb://",
)


def rollout(group: str, index: int, end_time: float, reward: float, size: int) -> Episode:
    eid = f"{group}-r{index}"
    return Episode(
        episode_id=eid,
        agent_id="agent",
        prompt=f"task {group}",
        steps=[Step(episode_id=eid, time=end_time, seq=0, kind="output", content=f"try {index}")],
        start_time=end_time - 1,
        end_time=end_time,
        outcome="success" if reward > 0.5 else "failure",
        group_id=group,
        group_size=size,
        reward=reward,
    )


def reference(rewards: list[float]) -> list[float]:
    """GRPO advantages computed here, independently of stream_export.groups.advantages."""
    if len(set(rewards)) == 1:
        return [0.0] * len(rewards)
    mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
    return [(r - mean) / (std + EPS) for r in rewards]


def records(settings: Settings, count: int, timeout: float) -> dict[str, list[GroupRecord]]:
    _, groups_topic = topic_names(settings.worker.app_id)
    found: dict[str, list[GroupRecord]] = defaultdict(list)
    for r in read_topic(
        settings.kafka.bootstrap_servers, groups_topic, count=count, timeout=timeout, settle=2.0
    ):
        record = decode_record(r.value)
        found[record.record_id].append(record)
    return found


def distinct_records(settings: Settings) -> set[str]:
    """The ids of the group records on the groups topic so far."""
    _, groups_topic = topic_names(settings.worker.app_id)
    try:
        found = read_so_far(
            settings.kafka.bootstrap_servers,
            groups_topic,
            partitions=settings.topics.partitions,
            timeout=5.0,
        )
    except (AssertionError, KafkaError):  # the topic not created yet
        return set()
    return {decode_record(r.value).record_id for r in found}


def files(out: Path, name: str) -> list[dict[str, Any]]:
    """The committed rows of one group output."""
    return [json.loads(x) for x in Follower(out, f"training-data.{name}", wait=False)]
