"""Scores joined in the stream on the real broker, with a real worker: scores
before an episode's end, within its hold and after it, duplicates and conflicts,
a kill -9 of the worker with late scores in flight; each score lands once, in its
episode's record or in the scores output."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stream_export.client import Producer
from stream_export.contract.topics import scores_topic
from stream_export.kafka import topics
from stream_export.output.follow import Follower
from stream_export.output.layout import checkpointed_offsets
from stream_export.rows import formats
from stream_export.settings import Settings
from tests.support.groups import records
from tests.support.processes import Worker, export
from tests.support.producer import produce
from tests.support.scoring import JUDGE, record
from tests.support.topic_reader import EpisodeReader, committed_offsets, end_offsets, read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
#: The evaluator of a score sent without a version: written with version null.
PERSON = {"id": "person", "version": None}


def rows(out: Path) -> list[dict[str, Any]]:
    """The committed rows of the scores output."""
    return [json.loads(x) for x in Follower(out, "training-data.scores", wait=False)]


def test_scores_before_during_and_after_the_hold_land_once_across_a_kill_9(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for(
        "scores.enabled=true",
        "scores.required=correctness",
        "scores.hold_s=2",
        "scores.reward=correctness + 0.5*format",
        "assemble.quiet_partition_s=1",
        "worker.session_timeout_s=6",
    )
    asyncio.run(topics.ensure(settings))
    out = Path(settings.sink.output_dir)
    reader = EpisodeReader(settings.kafka.bootstrap_servers, settings.topics.episodes)

    def published(*eids: str) -> Callable[[], bool]:
        return lambda: reader.poll() >= 0 and all(e in reader.copies for e in eids)

    async def first(producer: Producer) -> None:
        await record(producer, "before", before=["format", "correctness"])  # out at its end
        await record(producer, "during", before=["format"])  # held: correctness comes next
        await record(producer, "timeout", before=["format"])  # held till its hold is over
        await producer.score("during", "correctness", 1.0, **JUDGE)
        await producer.score("during", "correctness", 1.0, **JUDGE)  # the same: once
        await producer.score("during", "correctness", 0.0, **JUDGE)  # conflict
        await producer.score("nobody", "correctness", 1.0, **JUDGE)  # unknown episode
        await producer.flush()

    worker = Worker(settings, tmp_path / "worker.log").start()
    try:
        asyncio.run(_with(settings, first))
        wait_for(published("before", "during", "timeout"), timeout=60, what=worker.log)
        [timed_out] = reader.copies["timeout"]
        assert [x.name for x in timed_out.scores] == ["format"]
        assert timed_out.scores_missing == ["correctness"]
        assert timed_out.reward is None  # correctness not in time: no reward

        async def late(producer: Producer) -> None:
            await producer.score("timeout", "correctness", 1.0, **JUDGE)
            await producer.score("before", "helpfulness", 0.75, evaluator="person")
            await producer.flush()

        asyncio.run(_with(settings, late))
        wait_for(lambda: len(rows(out)) >= 2, timeout=30, what=worker.log)
        worker.kill9()  # the late scores' markers may not be stored yet: read again
        # a score sent again after the crash is still one row
        asyncio.run(_with(settings, late))
        worker = Worker(settings, tmp_path / "worker2.log").start()
        raw = b'{"type":"score","episode_id":"before","time":1,"score_id":"x","name":"n",'
        raw += b'"value":1e999,"evaluator":{"id":"j"}}'
        bootstrap = settings.kafka.bootstrap_servers
        asyncio.run(produce(bootstrap, settings.topics.steps, [(b"before", raw)]))
        # the new worker handled and acknowledged every step message, and the
        # scores output wrote every row the scores topic has
        steps, scores = settings.topics.steps, scores_topic(settings.worker.app_id)
        app = settings.worker.app_id
        wait_for(
            lambda: (
                committed_offsets(bootstrap, app, steps)
                == end_offsets(bootstrap, steps, settings.topics.partitions)
            ),
            timeout=60,
        )
        wait_for(
            lambda: _written(
                out, scores, end_offsets(bootstrap, scores, settings.topics.partitions)
            ),
            timeout=30,
        )
        dlq = settings.topics.dead_letters  # delivered before their steps were acknowledged
        dead = read_topic(
            bootstrap,
            dlq,
            count=sum(end_offsets(bootstrap, dlq, settings.topics.partitions).values()),
            timeout=10,
        )
        late_rows = read_topic(bootstrap, scores, count=2, timeout=10)
    finally:
        worker.stop()
        reader.close()
    reasons = {dict(d.headers)["x-reason"].decode() for d in dead}  # at least once
    assert reasons == {"conflicting_duplicate", "non_finite", "unknown_episode"}
    for eid, rewards, reward in [
        ("before", {"format": 0.5, "correctness": 0.5, "end_reward": 0.25}, 0.75),
        ("during", {"format": 0.5, "correctness": 1.0, "end_reward": 0.25}, 1.25),
    ]:
        copies = reader.copies[eid]
        assert all(copy == copies[0] for copy in copies)  # a repeat is the same record
        assert (copies[0].rewards, copies[0].reward) == (rewards, reward)
        assert [x.evaluator.version for x in copies[0].scores] == ["v1", "v1"]
    by_key: dict[bytes, set[bytes]] = {}
    for r in late_rows:
        by_key.setdefault(r.key, set()).add(r.value)
    assert all(len(v) == 1 for v in by_key.values()) and len(by_key) == 2
    assert all({"label", "request_id", "seq"} <= r.keys() for r in rows(out))  # null, not absent
    got = sorted((r["record_id"], r["name"], r["value"], r["evaluator"]["id"]) for r in rows(out))
    want = [("before", "helpfulness", 0.75, "person"), ("timeout", "correctness", 1.0, "judge")]
    assert got == want

    # export --with-scores joins the later scores: the timeout episode gets its reward
    joined = exported(settings, tmp_path / "joined.jsonl", "--with-scores")
    assert {e: r["reward"] for e, r in joined.items()} == {
        "before": 0.75,
        "during": 1.25,
        "timeout": 1.25,
    }
    plain = exported(settings, tmp_path / "plain.jsonl")
    assert plain["timeout"]["reward"] is None
    # and the reward's components reach the files: the episode format writes them,
    # every score with every field (no label, request id or seq here: null)
    assert (plain["timeout"]["scores_missing"], joined["timeout"]["scores_missing"]) == (
        ["correctness"],
        [],
    )
    assert joined["timeout"]["rewards"] == [
        {"name": "format", "value": 0.5},
        {"name": "correctness", "value": 1.0},
        {"name": "end_reward", "value": 0.25},
    ]
    fields = ["score_id", "name", "value", "evaluator", "time", "label", "request_id", "seq"]
    for written in joined.values():
        for entry in written["scores"]:
            assert list(entry) == fields and entry["label"] is entry["seq"] is None
            assert entry["evaluator"] in ({"id": "judge", "version": "v1"}, PERSON)
    assert PERSON in [e["evaluator"] for e in joined["before"]["scores"]]  # a late one
    # as do the other formats' metadata fields
    scored = ",".join(["episode_id", *formats.SCORE_FIELDS])
    columns = exported(
        settings,
        tmp_path / "columns.jsonl",
        "--with-scores",
        *("--set", "format.metadata_mode=columns", "--set", f"format.metadata_fields={scored}"),
        fmt="text",
    )
    for eid, row in columns.items():
        assert {f: row[f] for f in formats.SCORE_FIELDS} == {
            f: joined[eid][f] for f in formats.SCORE_FIELDS
        }


def exported(
    settings: Settings, target: Path, *flags: str, fmt: str = "episode"
) -> dict[str, dict[str, Any]]:
    """The record of each episode ``export`` writes (format episode)."""
    done = export(settings, "--to", str(target), "--format", fmt, "--quiet", *flags)
    assert done.returncode == 0, done.stderr
    records = map(json.loads, target.read_text().splitlines())
    return {r["episode_id"]: r for r in records}


def _written(out: Path, topic: str, ends: dict[int, int]) -> bool:
    done = checkpointed_offsets(out, topic)
    return all(done.get(p, -1) >= end - 1 for p, end in ends.items() if end)


async def _with(settings: Settings, act: Callable[[Producer], Any]) -> None:
    async with Producer.from_settings(settings) as producer:
        await act(producer)


def test_a_group_closes_with_its_members_scores_and_their_combined_rewards(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """Rollouts held for a judge's score reach the groups stage with it: the group
    (of size 2) closes once both are scored, its advantages from scores.reward."""
    settings = settings_for(
        "groups.enabled=true",
        "scores.required=correctness",
        "scores.hold_s=600",  # only the scores can end these holds in the test's time
        "scores.reward=correctness + 0.5*end_reward",
    )
    asyncio.run(topics.ensure(settings))

    async def rollouts(producer: Producer) -> None:
        for i, (correct, end) in enumerate([(1.0, 0.0), (0.0, 1.0)]):
            fields: dict[str, Any] = {"group_id": "g", "group_size": 2, "prompt": "task"}
            async with producer.episode(episode_id=f"r{i}", agent_id="a", **fields) as ep:
                await ep.output(f"answer {i}")
                await ep.end("success", reward=end)
            await producer.score(f"r{i}", "correctness", correct, **JUDGE)
        await producer.flush()

    with Worker(settings, tmp_path / "worker.log") as worker:
        asyncio.run(_with(settings, rollouts))
        found = records(settings, 1, 90.0)
        assert worker.alive(), worker.log()[-3000:]
    [[group]] = found.values()
    rewards = {e.episode_id: e.reward for e in group.rollouts}
    assert rewards == {"r0": 1.0, "r1": 0.5} and group.complete
    assert group.mean == 0.75
    advantages = dict(zip(rewards, group.advantages, strict=True))
    assert advantages == pytest.approx({"r0": 2**-0.5, "r1": -(2**-0.5)}, rel=1e-5)
