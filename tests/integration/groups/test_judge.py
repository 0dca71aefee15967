"""The group judge against the real vLLM test server and the real broker: groups
judged while the worker is killed with -9 are each published once, with one judge
score per rollout that the scores output holds once too; a judge that cannot be
reached is retried, then the group is published without its score, counted."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from stream_export.client import Producer
from stream_export.contract.topics import topic_names
from stream_export.groups.advantages import score
from stream_export.groups.judge import score_id
from stream_export.kafka import topics
from stream_export.output.follow import Follower
from stream_export.settings import Settings
from tests.support.groups import records
from tests.support.monitoring import free_port, get
from tests.support.processes import Worker
from tests.support.topic_reader import committed_offsets, end_offsets
from tests.support.vllm_server import VllmServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

SIZE = 3
JUDGED = (
    "groups.enabled=true",
    "scores.enabled=true",
    "groups.judge_max_chars=100",  # the test server's context is 512 tokens
    "groups.judge_backoff_s=0.05",
    "groups.judge_concurrency=1",
    "assemble.quiet_partition_s=1",
    "worker.session_timeout_s=6",
    "http.enabled=true",
)


OK = 'stream_export_group_judge_calls_total{result="ok"}'
FAILED = 'stream_export_group_judge_calls_total{result="failed"}'
JUDGING = "stream_export_groups_judging"


def rows(out: Path, output: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in Follower(out, f"training-data.{output}", wait=False)]


def metric(port: int, sample: str) -> float:
    """One sample's value on the worker's /metrics (0 while it does not answer)."""
    try:
        body = get(f"http://127.0.0.1:{port}/metrics")[1].decode()
    except OSError:
        return 0.0
    found = re.search(rf"^{re.escape(sample)} (\S+)$", body, re.M)
    return float(found.group(1)) if found else 0.0


async def _groups(settings: Settings, first: int, count: int) -> None:
    async with Producer.from_settings(settings) as producer:
        for g in range(first, first + count):
            for r in range(SIZE):
                fields: dict[str, Any] = {"group_id": f"g{g}", "group_size": SIZE}
                eid = f"g{g}-r{r}"
                async with producer.episode(
                    episode_id=eid, agent_id="a", prompt=f"What is {g} + 7?", **fields
                ) as ep:
                    await ep.output(f"It is {g + r * 7}.")
                    await ep.end("success", reward=0.0)
        await producer.flush()


def test_groups_are_judged_once_across_a_kill_9(
    settings_for: Callable[..., Settings], vllm_server: VllmServer, tmp_path: Path
) -> None:
    """The first worker's judge never answers (nothing listens at its URL), so its
    groups are surely being judged, and stored so, when it is killed with -9; the
    next worker (the judge's URL mended) judges them from the stored state."""
    port = free_port()
    common = (*JUDGED, f"http.port={port}", f"groups.judge_model={vllm_server.model}")
    down = settings_for(
        *common,
        f"groups.judge_url=http://127.0.0.1:{free_port()}/v1",
        "groups.judge_attempts=100",
        "groups.judge_backoff_max_s=0.2",
    )
    settings = settings_for(
        *common, f"groups.judge_url={vllm_server.url}/v1", "groups.judge_version=prompt-1"
    )
    settings.topics, settings.worker.app_id = down.topics, down.worker.app_id
    settings.sink.output_dir = down.sink.output_dir
    asyncio.run(topics.ensure(settings))
    out, bootstrap = Path(settings.sink.output_dir), settings.kafka.bootstrap_servers
    by_group, _ = topic_names(settings.worker.app_id)
    count = 6
    worker = Worker(down, tmp_path / "worker.log").start()
    try:
        asyncio.run(_groups(settings, 0, count))

        def judging() -> float:
            return sum(metric(port, f'{JUDGING}{{partition="{p}"}}') for p in (0, 1))

        wait_for(lambda: judging() == count, timeout=60, what=worker.log)
        # every group's closing rollout acknowledged: the groups are stored as being judged
        ends = end_offsets(bootstrap, by_group, settings.topics.partitions)
        app = settings.worker.app_id

        def acknowledged() -> bool:
            done = committed_offsets(bootstrap, app, by_group)
            return all(done.get(p, 0) >= end for p, end in ends.items())

        wait_for(acknowledged, timeout=30, what=worker.log)
        assert metric(port, FAILED) >= 1  # it did ask, and was refused
        worker.kill9()
        worker = Worker(settings, tmp_path / "worker2.log").start()
        found = records(settings, count, 60.0)
        judged = set(found)
        wait_for(lambda: {r["group_id"] for r in rows(out, "groups")} == judged, timeout=30)
        wait_for(lambda: len(rows(out, "scores")) >= count * SIZE, timeout=30, what=worker.log)
        ok = metric(port, OK)
        left = judging()
        log = worker.log()
    finally:
        worker.stop()
    assert judged == {f"g{g}" for g in range(count)}
    assert ok >= count and left == 0
    rebuilt = [int(n) for n in re.findall(r"\((\d+) being judged\)", log)]
    assert sum(rebuilt) >= count, rebuilt  # restored as being judged, not replayed
    group_rows = rows(out, "groups")
    assert sorted(r["group_id"] for r in group_rows) == sorted(judged)  # each once
    score_rows = rows(out, "scores")
    by_rollout = {r["episode_id"]: r for r in score_rows}
    assert len(score_rows) == len(by_rollout) == count * SIZE  # one row per rollout
    for group_id, copies in found.items():
        assert all(copy == copies[0] for copy in copies), group_id  # one verdict's scores
        group = copies[0]
        rewards = [e.rewards["judge"] for e in group.rollouts]
        assert [e.reward for e in group.rollouts] == rewards  # no scores.reward: the judge's
        assert all(v * 10 == round(v * 10) and 0 <= v <= 1 for v in rewards)
        for episode in group.rollouts:
            row = by_rollout[episode.episode_id]
            assert row["value"] == episode.rewards["judge"]
            assert row["score_id"] == score_id(vllm_server.model, group_id, episode.episode_id)
            assert row["evaluator"] == {"id": vllm_server.model, "version": "prompt-1"}
        want = score(rewards, estimator="grpo", eps=1e-6, ddof=1)
        assert group.advantages == pytest.approx(want.advantages)


def test_a_judge_that_cannot_be_reached_is_retried_then_the_group_closes_without_it(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    port = free_port()
    settings = settings_for(
        *JUDGED,
        f"http.port={port}",
        f"groups.judge_url=http://127.0.0.1:{free_port()}/v1",  # nothing listens
        "groups.judge_model=tiny",
        "groups.judge_attempts=3",
    )
    asyncio.run(topics.ensure(settings))
    out = Path(settings.sink.output_dir)
    with Worker(settings, tmp_path / "worker.log") as worker:
        asyncio.run(_groups(settings, 0, 2))
        found = records(settings, 2, 60.0)
        failed = 'stream_export_group_verdicts_total{result="failed"}'
        wait_for(lambda: metric(port, failed) == 2, timeout=10, what=worker.log)
        calls = {
            result: metric(port, f'stream_export_group_judge_calls_total{{result="{result}"}}')
            for result in ("ok", "failed", "gave_up")
        }
        assert worker.alive(), worker.log()[-3000:]
    assert calls == {"ok": 0, "failed": 6, "gave_up": 2}
    assert set(found) == {"g0", "g1"}
    for [group] in found.values():
        assert all(
            e.scores_missing == ["judge"] and "judge" not in e.rewards for e in group.rollouts
        )
        assert [e.reward for e in group.rollouts] == [0.0] * SIZE  # the end event's
    assert rows(out, "scores") == []
