"""Scores joined in the stream by two workers of one app, each killed with -9 while
steps and scores arrive, one kept away past its session so that its partitions
move to the other and back: every published episode carries exactly the scores
that arrived in time (decided by its partition's order alone), and every later
score is one row of the scores output, whichever worker wrote it."""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stream_export.client import Producer
from stream_export.kafka import topics
from stream_export.output.follow import Follower
from stream_export.settings import Settings
from tests.support.processes import Worker, fleet_member
from tests.support.scoring import JUDGE, record
from tests.support.topic_reader import EpisodeReader, committed_offsets, end_offsets, read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

SETTINGS = (
    "topics.partitions=4",
    "scores.enabled=true",
    "scores.required=correctness",
    "scores.hold_s=2",
    "scores.reward=correctness + 0.5*format",
    "assemble.quiet_partition_s=1",
    "assemble.persist_interval_s=0.2",
    "worker.session_timeout_s=6",
)
#: A worker's log line once it owns some steps partitions.
OWNS = re.compile(r"assemble: \d+ open episodes on partitions \[\d")
EPISODES = 48
#: What each kind of episode is published with: its scores, what is missing, reward.
IN_TIME: dict[str, tuple[dict[str, float], list[str], float | None]] = {
    "before": ({"format": 0.5, "correctness": 0.5}, [], 0.75),  # both before its end
    "held": ({"format": 0.5, "correctness": 1.0}, [], 1.25),  # correctness just after
    "timeout": ({"format": 0.5}, ["correctness"], None),  # correctness only later
}


def kind(eid: str) -> str:
    return ("before", "held", "timeout")[int(eid[1:]) % 3]


async def first_wave(producer: Producer, eids: list[str]) -> None:
    for eid in eids:
        k = kind(eid)
        await record(
            producer, eid, before=["format", "correctness"] if k == "before" else ["format"]
        )
        if k == "held":
            await producer.score(eid, "correctness", 1.0, **JUDGE)
    await producer.flush()


def late_scores(eids: list[str]) -> list[tuple[str, str, float, dict[str, Any]]]:
    """(episode, name, value, evaluator) of each score sent after publication."""
    late = [(e, "correctness", 1.0, JUDGE) for e in eids if kind(e) == "timeout"]
    late += [(e, "helpfulness", 0.75, {"evaluator": "person"}) for e in eids[::5]]
    return late


async def send(producer: Producer, scores: list[tuple[str, str, float, dict[str, Any]]]) -> None:
    for eid, name, value, who in scores:
        await producer.score(eid, name, value, **who)
    await producer.flush()


def rows(out: Path) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for worker in ("w1", "w2")
        for line in Follower(out, f"{worker}.scores", wait=False)
    ]


def test_two_workers_killed_and_moved_join_every_score_once(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    base = settings_for(*SETTINGS)
    asyncio.run(topics.ensure(base))
    out, bootstrap = tmp_path / "out", base.kafka.bootstrap_servers
    rng = random.Random(28)

    def worker(name: str) -> Worker:
        return Worker(
            settings_for(*SETTINGS, *fleet_member(name, tmp_path, out)),
            tmp_path / f"{name}-{time.monotonic_ns()}.log",
        )

    async def with_producer(act: Callable[[Producer], Any]) -> None:
        async with Producer.from_settings(base) as producer:
            await act(producer)

    def both_own() -> None:
        wait_for(
            lambda: all(OWNS.search(w.log()) for w in workers.values()),
            timeout=90,
            what=lambda: "both workers to own steps partitions",
        )

    eids = [f"e{i:02d}" for i in range(EPISODES)]
    late = late_scores(eids)
    reader = EpisodeReader(bootstrap, base.topics.episodes)
    workers = {"w1": worker("w1").start(), "w2": worker("w2").start()}
    try:
        both_own()
        half = EPISODES // 2
        asyncio.run(with_producer(lambda p: first_wave(p, eids[:half])))
        time.sleep(rng.uniform(0.1, 1.0))
        workers["w1"].kill9()  # with episodes open, held and published
        asyncio.run(with_producer(lambda p: first_wave(p, eids[half:])))
        time.sleep(8)  # past the session: w1's partitions move to w2
        workers["w1"] = worker("w1").start()  # and back
        wait_for(
            lambda: reader.poll() >= EPISODES,
            timeout=90,
            what=lambda: f"{EPISODES} episodes, {len(reader.copies)} so far",
        )
        both_own()
        # late scores, each sent twice, one conflicting; w2 killed while they arrive
        conflict = (late[0][0], late[0][1], 0.0, late[0][3])
        asyncio.run(with_producer(lambda p: send(p, late[: len(late) // 2])))
        workers["w2"].kill9()
        asyncio.run(with_producer(lambda p: send(p, [*late, conflict])))
        workers["w2"] = worker("w2").start()  # at once: its partitions never left
        steps, app, n = base.topics.steps, base.worker.app_id, base.topics.partitions
        wait_for(
            lambda: (
                committed_offsets(bootstrap, app, steps) == end_offsets(bootstrap, steps, n)
                and len(rows(out)) >= len(late)
            ),
            timeout=120,
            interval=1.0,
            what=lambda: (
                f"every step handled ({committed_offsets(bootstrap, app, steps)} of "
                f"{end_offsets(bootstrap, steps, n)}) and {len(late)} score rows ({len(rows(out))})"
            ),
        )
        reader.poll()
        dlq = base.topics.dead_letters
        dead = read_topic(
            bootstrap,
            dlq,
            count=sum(end_offsets(bootstrap, dlq, n).values()),
            timeout=10,
        )
    finally:
        for w in workers.values():
            w.stop()
        reader.close()

    assert sorted(reader.copies) == eids
    for eid in eids:
        first, *again = reader.copies[eid]
        assert all(copy == first for copy in again), eid  # a replay publishes the same
        scores, missing, reward = IN_TIME[kind(eid)]
        got = {s.name: s.value for s in first.scores}
        assert (got, first.scores_missing, first.reward) == (scores, missing, reward), eid
    written = Counter(
        (r["record_id"], r["name"], r["value"], r["evaluator"]["id"]) for r in rows(out)
    )
    want = Counter((e, name, value, who.get("evaluator")) for e, name, value, who in late)
    assert written == want  # each later score once, across both workers' files
    reasons = Counter(dict(d.headers)["x-reason"].decode() for d in dead)
    assert set(reasons) == {"conflicting_duplicate"}, reasons
