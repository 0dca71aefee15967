"""The groups stage on the real broker: rollouts of many groups over 4 partitions and
two workers, out of order, with duplicates, late rollouts and a kill -9 mid-way."""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import random
import re
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from stream_export.contract.episode import Episode
from stream_export.kafka import topics
from stream_export.ops import demo
from stream_export.output.follow import Follower
from stream_export.settings import Settings
from tests.support.groups import SETTINGS, distinct_records, files, records, reference, rollout
from tests.support.monitoring import free_port, get
from tests.support.processes import Worker
from tests.support.sinkkafka import message, publish
from tests.support.topic_reader import header, read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

#: A worker's log line once it owns two of the four groups partitions.
SHARED = re.compile(r"open groups on partitions \[\d, \d\] rebuilt")
#: Demo tasks of this seed: one all-success group, two whose rollouts differ.
DEMO_SEED = 26


@dataclass
class Plan:
    """What the test sends, and what it therefore expects."""

    sent: list[Episode] = field(default_factory=list)
    #: group -> episode ids it must close with (emitted groups only)
    members: dict[str, set[str]] = field(default_factory=dict)
    rewards: dict[str, float] = field(default_factory=dict)
    incomplete: set[str] = field(default_factory=set)
    dropped: set[str] = field(default_factory=set)
    zero_variance: set[str] = field(default_factory=set)
    late: list[Episode] = field(default_factory=list)


def make_plan(rng: random.Random, groups: int, now: float) -> Plan:
    plan = Plan()
    for g in range(groups):
        name = f"g{g:03d}"
        size = rng.randint(4, 16)
        kind = rng.random()
        equal = rng.random() < 0.1
        rewards = [0.5 if equal else rng.choice([0.0, 0.25, 1.0]) for _ in range(size)]
        arrive = size
        if kind < 0.1:
            arrive = rng.randint(2, size - 1)  # times out incomplete
        elif kind < 0.15:
            arrive = 1  # times out too small: dropped
        episodes = [
            rollout(name, i, now + rng.uniform(0, 1), rewards[i], size) for i in range(size)
        ]
        plan.sent += episodes[:arrive]
        for e in episodes:
            plan.rewards[e.episode_id] = rewards[int(e.episode_id.rsplit("r", 1)[1])]
        if arrive == 1:
            plan.dropped.add(name)
        else:
            plan.members[name] = {e.episode_id for e in episodes[:arrive]}
            if arrive < size:
                plan.incomplete.add(name)
                plan.late.append(episodes[arrive])  # sent once the group has closed
            if len({rewards[i] for i in range(arrive)}) == 1:
                plan.zero_variance.add(name)
    return plan


def test_two_hundred_groups_over_two_workers_and_a_kill9(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    base = settings_for(*SETTINGS)

    def worker(name: str) -> Worker:
        s = settings_for(
            *SETTINGS,
            f"worker.worker_id={name}",
            f"worker.data_dir={tmp_path / name / 'state'}",
            f"sink.output_dir={tmp_path / name / 'out'}",
        )
        return Worker(s, tmp_path / f"{name}.log")

    rng = random.Random(15)
    plan = make_plan(rng, 200, time.time())
    sent = plan.sent + rng.sample(plan.sent, len(plan.sent) // 20)  # with duplicates
    # before the kill: every rollout of the first 30 groups, half of the others'
    whole = [e for e in sent if e.group_id is not None and e.group_id < "g030"]
    rest = [e for e in sent if e not in whole]
    rng.shuffle(rest)
    before = whole + rest[: len(rest) // 2]
    rng.shuffle(before)  # out of order
    after = rest[len(rest) // 2 :]
    publish(base, [message(e) for e in before])  # creates the topics, the groups' too
    a, b = worker("w1").start(), worker("w2").start()
    try:
        wait_for(
            lambda: all(SHARED.search(w.log()) for w in (a, b)),
            timeout=120,
            what="both workers to own groups partitions",
        )
        wait_for(lambda: len(distinct_records(base)) >= 5, timeout=120, what="the first groups")
        a.kill9()  # mid-way: most groups are still open, a third of the rollouts unsent
        publish(base, [message(e) for e in after])
        a = worker("w1").start()
        wanted = set(plan.members)
        emitted = len(wanted)
        assert len(distinct_records(base)) < emitted

        def missing(label: str, got: set[str]) -> str:
            """A failed wait's message: the first absent groups, the logs at the deadline."""
            absent = sorted(wanted - got)[:10]
            return f"{label}: missing {absent}\n{a.log()[-3000:]}\n{b.log()[-3000:]}"

        closed: set[str] = set()

        def all_closed() -> bool:
            closed.update(distinct_records(base))
            return wanted <= closed

        wait_for(
            all_closed,
            timeout=120,
            interval=1.0,
            what=lambda: missing(f"{emitted} groups", closed),
        )
        publish(base, [message(e) for e in plan.late])
        late_ids = {f"{e.group_id}/late/{e.episode_id}" for e in plan.late}
        seen: set[str] = set()

        def all_late() -> bool:
            seen.update(distinct_records(base))
            return late_ids <= seen

        wait_for(
            all_late,
            timeout=60,
            interval=1.0,
            what=f"the late rollouts: missing {sorted(late_ids - seen)[:5]} of {len(late_ids)}",
        )
        found = records(base, emitted + len(late_ids), 30.0)
        outs = [tmp_path / name / "out" for name in ("w1", "w2")]
        wait_for(
            lambda: len(group_rows(outs)) >= emitted,
            timeout=60,
            what=lambda: missing(f"{emitted} group rows in the files", set(group_rows(outs))),
        )
    finally:
        a.stop()
        b.stop()
    # the files, written by both workers' sinks, hold every emitted group once
    assert sorted(group_rows(outs)) == sorted(plan.members)

    assert set(found) == set(plan.members) | late_ids
    for record_id, copies in found.items():
        first = copies[0]
        for copy in copies[1:]:
            differ = {
                f: (getattr(first, f), getattr(copy, f))
                for f in first.__struct_fields__
                if f != "rollouts" and getattr(first, f) != getattr(copy, f)
            }
            order = ([e.episode_id for e in first.rollouts], [e.episode_id for e in copy.rollouts])
            assert copy == first, f"{record_id}: re-emitted differently: {differ} {order}"
        ids = [e.episode_id for e in first.rollouts]
        assert len(ids) == len(set(ids))  # each rollout once
        if record_id in late_ids:
            assert (first.close_reason, first.complete, first.size) == ("late", False, 1)
            continue
        assert set(ids) == plan.members[record_id]
        rewards = [plan.rewards[i] for i in ids]
        for got, want in zip(first.advantages, reference(rewards), strict=True):
            assert got is not None and math.isclose(got, want, rel_tol=1e-12, abs_tol=1e-12)
        assert first.complete == (record_id not in plan.incomplete)
        assert first.close_reason == ("timeout" if record_id in plan.incomplete else "size")
        if record_id in plan.incomplete:
            assert first.missing == first.expected_size - len(ids)  # type: ignore[operator]
    assert {g for g, c in found.items() if not c[0].complete and g not in late_ids} == (
        plan.incomplete
    )
    assert {g for g, c in found.items() if c[0].zero_variance and g not in late_ids} == (
        plan.zero_variance
    )
    dead = read_topic(
        base.kafka.bootstrap_servers,
        base.topics.dead_letters,
        count=len(plan.late),
        timeout=30,
    )
    late_letters = [d for d in dead if header(d, "x-reason") == "late_rollout"]
    assert {d.value for d in late_letters} >= {message(e)[1] for e in plan.late}


def test_the_demo_fleet_fills_its_groups_through_the_whole_pipeline(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """Steps -> assembler -> episodes -> groups: each demo task is one full group."""
    settings = settings_for("groups.enabled=true")
    asyncio.run(topics.ensure(settings))
    tasks = 3
    with Worker(settings, tmp_path / "worker.log"):
        asyncio.run(
            demo.run(
                settings.kafka.bootstrap_servers,
                settings.topics.steps,
                rate=0,
                count=tasks * demo.ROLLOUTS,
                seed=DEMO_SEED,
            )
        )
        found = records(settings, tasks, 120.0)
        out = Path(settings.sink.output_dir)

        def written() -> list[dict[str, Any]]:
            rows = files(out, "groups")
            return rows if len(rows) >= tasks else []

        rows: list[dict[str, Any]] = wait_for(
            written, timeout=60, what="the group rows in the files"
        )
        spread = [r for r in rows if not r["zero_variance"]]
        counts = {
            "rollouts": tasks * demo.ROLLOUTS,
            "preference": len(spread),
            "kto": sum(len(r["episode_ids"]) for r in spread),
            "prompts": tasks,
        }
        wait_for(
            lambda: all(len(files(out, n)) >= c for n, c in counts.items()),
            timeout=60,
            what=f"the rows of every output {counts}",
        )
    played = list(itertools.islice(demo.scripts(seed=DEMO_SEED), tasks * demo.ROLLOUTS))
    want: dict[str, set[str]] = defaultdict(set)
    for script in played:
        want[script.group_id].add(script.episode_id)
    assert set(found) == set(want)
    for group_id, copies in found.items():
        record = copies[0]
        assert (record.close_reason, record.complete, record.size) == ("size", True, 4)
        assert {e.episode_id for e in record.rollouts} == want[group_id]
        assert record.expected_size == demo.ROLLOUTS
    assert sorted(r["group_id"] for r in rows) == sorted(want)  # each group once
    for row in rows:
        assert set(row["episode_ids"]) == want[row["group_id"]] and row["complete"]
        assert row["advantages"] == pytest.approx(reference(row["rewards"]), rel=1e-12)
    assert counts["preference"] == 2 and counts["kto"] == 8  # see DEMO_SEED
    assert {n: len(files(out, n)) for n in counts} == counts  # each row once
    rollouts = files(out, "rollouts")
    assert {r["episode_id"] for r in rollouts} == {s.episode_id for s in played}
    assert {r["uid"] for r in rollouts} == set(want)
    for pair in files(out, "preference"):
        assert pair["chosen_reward"] > pair["rejected_reward"] and pair["prompt"]
    by_group = {r["group_id"]: r for r in rows}
    for task in files(out, "prompts"):
        group = by_group[task["group_id"]]
        passed = group["outcomes"].count("success") / 4
        assert task == {
            "prompt": group["prompt"],
            "group_id": group["group_id"],
            "pass_rate": passed,
            "mean_reward": group["mean"],
            "scored": 4,
        }


def group_rows(outs: list[Path]) -> list[str]:
    """The group ids of the committed group rows under every worker's output."""
    return [row["group_id"] for out in outs for row in files(out, "groups")]


def dropped_and_closed(port: int, worker: Worker, reason: str) -> None:
    """Wait until the worker's /metrics show one group dropped for ``reason`` and one
    closed at its size."""
    wanted = {
        f'stream_export_groups_dropped_total{{reason="{reason}"}} 1.0',
        'stream_export_groups_closed_total{reason="size"} 1.0',
    }
    wait_for(
        lambda: wanted <= set(get(f"http://127.0.0.1:{port}/metrics")[1].decode().splitlines()),
        timeout=90,
        what=f"one group dropped ({reason}), one closed\n{worker.log()[-2000:]}",
    )


def test_zero_variance_groups_are_left_out_of_every_output_when_asked(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """groups.drop_zero_variance=reward: the group whose rewards are all equal is
    counted as dropped and written nowhere; the other one everywhere."""
    port = free_port()
    settings = settings_for(
        "groups.enabled=true",
        "groups.drop_zero_variance=reward",
        "http.enabled=true",
        f"http.port={port}",
    )
    now = time.time()
    sent = [rollout("g-equal", i, now + i, 1.0, 2) for i in range(2)]
    sent += [rollout("g-spread", i, now + i, float(i), 2) for i in range(2)]
    publish(settings, [message(e) for e in sent])
    with Worker(settings, tmp_path / "worker.log") as worker:
        dropped_and_closed(port, worker, "zero_variance")
        out = Path(settings.sink.output_dir)
        wanted = {"groups": 1, "rollouts": 2, "preference": 1, "kto": 2, "prompts": 1}
        wait_for(
            lambda: all(len(files(out, n)) >= c for n, c in wanted.items()),
            timeout=60,
            what=f"the rows of every output {wanted}",
        )
    assert set(records(settings, 1, 10.0)) == {"g-spread"}
    for name, count in wanted.items():
        rows = files(out, name)
        groups = {r.get("group_id", r.get("uid")) for r in rows}
        assert (len(rows), groups) == (count, {"g-spread"}), name


def test_a_group_too_large_for_its_topic_is_dead_lettered_and_the_worker_goes_on(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """A group whose record would exceed assemble.max_record_bytes: a summary on the
    dead-letter topic (reason group_too_large), counted as dropped; the next group and
    every rollout of the big one are still written."""
    port = free_port()
    settings = settings_for(
        "groups.enabled=true",
        "assemble.max_event_bytes=8192",
        "assemble.max_episode_bytes=8192",
        "http.enabled=true",
        f"http.port={port}",
    )
    now = time.time()
    big = [rollout("g-big", i, now + i, float(i), 4) for i in range(4)]
    for episode in big:
        # each fits max_record_bytes (8192 + 32768); the four together do not
        episode.steps[0].content = "x" * 12_000
    small = [rollout("g-small", i, now + 10 + i, float(i), 2) for i in range(2)]
    publish(settings, [message(e) for e in big + small])
    with Worker(settings, tmp_path / "worker.log") as worker:
        dropped_and_closed(port, worker, "too_large")
        out = Path(settings.sink.output_dir)
        wait_for(
            lambda: (
                len(files(out, "groups")) >= 1
                and len(list(Follower(out, "training-data", wait=False))) >= 6
            ),
            timeout=60,
            what="the small group's row and the six episodes",
        )
        assert worker.alive()
    assert set(records(settings, 1, 10.0)) == {"g-small"}
    assert {r["group_id"] for r in files(out, "groups")} == {"g-small"}
    prompts = [json.loads(line)["prompt"] for line in Follower(out, "training-data", wait=False)]
    assert prompts.count("task g-big") == 4  # every rollout, in the episode output
    (letter,) = [
        d
        for d in read_topic(
            settings.kafka.bootstrap_servers, settings.topics.dead_letters, count=1, timeout=30
        )
        if header(d, "x-reason") == "group_too_large"
    ]
    summary = json.loads(letter.value)
    assert summary["group_id"] == "g-big" and summary["size"] == 4
    assert sorted(summary["episode_ids"]) == sorted(e.episode_id for e in big)
    assert summary["record_bytes"] > 8192


#: Planted in the worker: Faust's seek to the committed offsets, once the tables are
#: recovered, takes 2 s longer (a slow broker), and each episode takes 0.2 s to
#: regroup (a busy worker). Faust resumes the stream partitions before that seek and
#: clears the streams' queues after it; its fetcher, started to read the changelogs,
#: keeps running in between (and a fetch waiting when the changelogs are paused asks
#: for an empty set of partitions: every partition, to aiokafka).
