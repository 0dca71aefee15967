"""Every group output exactly once across two workers, repeated kill -9 and
partitions moving between live workers: 240 groups of 2-16 rollouts (out of order,
with copies, late rollouts, rollouts of another task under a group id) published
in waves while the workers are killed one after the other, some restarted at once
(static membership: they get their partitions back), some only after their
session expired (their partitions move to the live worker, and back), once killed
again within a second of getting them back. Both workers share one output
directory (their own ``sink.prefix``), the configuration the README guarantees
exactly once for. Every copy of every record on the groups topic is checked (one
version of each), and every row of the five group outputs against rows built
here from the plan, independently of the worker."""

from __future__ import annotations

import random
import re
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import msgspec
import pytest

from stream_export.contract.episode import Episode
from stream_export.contract.events import Step
from stream_export.contract.topics import topic_names
from stream_export.settings import Settings
from tests.support.groups import reference
from tests.support.processes import Worker, fleet_member
from tests.support.sinkfiles import all_lines
from tests.support.sinkkafka import message, publish
from tests.support.topic_reader import header, read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

SETTINGS = (
    "topics.partitions=4",
    "groups.enabled=true",
    "groups.timeout_s=600",
    "assemble.idle_timeout_s=2.5",
    "assemble.grace_s=0.5",
    "assemble.quiet_partition_s=3",
    "assemble.persist_interval_s=0.2",
    "worker.store=rocksdb://",
    "worker.session_timeout_s=6",
)
OUTPUTS = ("groups", "rollouts", "preference", "kto", "prompts")
#: A worker's log line once it owns (and has rebuilt) some groups partitions.
OWNS = re.compile(r"open groups on partitions \[\d")
#: Faust's log line once the worker has started.
READY = "[^Worker]: Ready"
#: A sink's log line when it is assigned a partition.
ASSIGNED = "starts at offset"


def rollout(group: str, i: int, reward: float, size: int, end: float, task: str = "") -> Episode:
    eid = f"{group}-r{i}"
    return Episode(
        episode_id=eid,
        agent_id="agent",
        prompt=task or f"task {group}",
        steps=[Step(episode_id=eid, time=end, seq=0, kind="output", content=f"try {i}")],
        start_time=end - 1,
        end_time=end,
        outcome="success" if reward >= 0.5 else "failure",
        group_id=group,
        group_size=size,
        reward=reward,
    )


@dataclass
class Plan:
    waves: list[list[Episode]] = field(default_factory=list)
    #: emitted group -> its members' (episode id, reward), and whether it is complete
    members: dict[str, dict[str, float]] = field(default_factory=dict)
    complete: dict[str, bool] = field(default_factory=dict)
    late: list[Episode] = field(default_factory=list)
    mismatched: list[Episode] = field(default_factory=list)
    copies: Counter[str] = field(default_factory=Counter)


def make_plan(rng: random.Random, groups: int, waves: int, now: float) -> Plan:
    """Complete groups end now (their 600 s timeout never comes); incomplete ones
    ended long ago, so they time out as soon as every source's watermark says all
    their rollouts are in (and a late one follows once they closed). A rollout of
    another task under a group id follows once every group closed."""
    plan = Plan(waves=[[] for _ in range(waves)])
    for g in range(groups):
        name, size = f"f{g:03d}", rng.randint(2, 16)
        if g % 10 == 0:  # zero variance: no preference or kto rows
            rewards = [0.5] * size
        else:
            rewards = [rng.choice([0.0, 0.25, 1.0]) for _ in range(size)]
        incomplete = g % 9 == 0 and size > 2
        arrive = rng.randint(2, size - 1) if incomplete else size
        end = now - 1000 if incomplete else now
        episodes = [
            rollout(name, i, rewards[i], size, end + rng.uniform(0, 1)) for i in range(size)
        ]
        first = rng.randrange(waves - 1)
        for e in episodes[:arrive]:  # a group's rollouts over two waves, out of order
            plan.waves[first + rng.randint(0, 1) if not incomplete else 0].append(e)
        plan.members[name] = {e.episode_id: rewards[i] for i, e in enumerate(episodes[:arrive])}
        plan.complete[name] = not incomplete
        if incomplete:
            plan.late.append(episodes[arrive])
        if g % 25 == 7:  # another task under this group id, once it closed
            plan.mismatched.append(rollout(name, 99, 1.0, size, end, task=f"another task {g}"))
    for wave in plan.waves:
        for e in rng.sample(wave, len(wave) // 20):  # copies from another position
            wave.insert(rng.randint(0, len(wave)), e)
            plan.copies[e.group_id or ""] += 1
        rng.shuffle(wave)
    return plan


def expected_rows(plan: Plan) -> dict[str, Counter[tuple[Any, ...]]]:
    """The key of every row each output must hold, once."""
    want: dict[str, Counter[tuple[Any, ...]]] = {name: Counter() for name in OUTPUTS}
    for group, members in plan.members.items():
        rewards = list(members.values())
        spread = len(set(rewards)) > 1
        want["groups"][(group, tuple(sorted(members)))] += 1
        want["prompts"][(group, sum(r >= 0.5 for r in rewards) / len(rewards))] += 1
        for eid in members:
            want["rollouts"][(group, eid, plan.complete[group])] += 1
            if spread:
                want["kto"][(group, eid)] += 1
        if spread:
            want["preference"][(group, max(rewards), min(rewards))] += 1
    for e in plan.late:
        want["rollouts"][(e.group_id, e.episode_id, False)] += 1
    return want


def row_key(output: str, row: dict[str, Any]) -> tuple[Any, ...]:
    if output == "groups":
        return (row["group_id"], tuple(sorted(row["episode_ids"])))
    if output == "prompts":
        return (row["group_id"], row["pass_rate"])
    if output == "rollouts":
        return (row["uid"], row["episode_id"], row["complete"])
    if output == "kto":
        return (row["group_id"], row["completion"].strip().replace("try ", f"{row['group_id']}-r"))
    return (row["group_id"], row["chosen_reward"], row["rejected_reward"])


def rows(folders: dict[str, Path], output: str) -> list[dict[str, Any]]:
    """Every row of ``output`` the workers (name: output folder) wrote."""
    found = []
    for worker, out in folders.items():
        try:
            found += [msgspec.json.decode(line) for line in all_lines(out, f"{worker}.{output}")]
        except AssertionError:  # read while a worker writes; the final read is checked
            return []
    return found


def assigned(worker: Worker, since: int) -> bool:
    """Whether a sink of the worker was assigned a partition since ``since``."""
    return ASSIGNED in worker.log()[since:]


def ready(worker: Worker, started: int, since: int) -> bool:
    """Whether the worker (its process began at ``started`` in its log) has started
    and rebuilt some groups partitions since ``since``."""
    return READY in worker.log()[started:] and owns(worker, since)


def owns(worker: Worker, since: int) -> bool:
    """Whether the worker has rebuilt some groups partitions in its log since
    ``since`` (where its current process began)."""
    return bool(OWNS.search(worker.log(), since))


def test_every_group_output_once_over_two_workers_killed_again_and_again(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    base = settings_for(*SETTINGS, f"sink.output_dir={tmp_path / 'out'}")
    out = tmp_path / "out"
    folders = {"w1": out, "w2": out}

    def worker(name: str) -> Worker:
        return Worker(
            settings_for(*SETTINGS, *fleet_member(name, tmp_path, out)), tmp_path / f"{name}.log"
        )

    rng = random.Random(25)
    plan = make_plan(rng, 240, 7, time.time())
    publish(base, [message(e) for e in plan.waves[0]])
    workers = {"w1": worker("w1").start(), "w2": worker("w2").start()}
    since = {"w1": 0, "w2": 0}
    try:
        # kill -9 one worker per wave, alternating, once both own groups partitions;
        # every other one comes back only after its session expired, so its
        # partitions move to the live worker (and back when it rejoins)
        for n, wave in enumerate(plan.waves[1:]):
            wait_for(
                lambda: all(owns(w, since[n]) for n, w in workers.items()),
                timeout=120,
                what=lambda: (
                    "both workers to own groups partitions\n"
                    + "\n".join(w.log()[-2000:] for w in workers.values())
                ),
            )
            time.sleep(rng.uniform(0.2, 2.0))
            name = ("w1", "w2")[n % 2]
            workers[name].kill9()
            publish(base, [message(e) for e in wave])
            if n % 2:
                time.sleep(8)  # past worker.session_timeout_s: a rebalance moves them
            since[name] = len(workers[name].log())
            workers[name] = worker(name).start()
            if n == 3:  # the new owner dies within a second of getting partitions back
                back = workers[name]
                wait_for(partial(assigned, back, since[name]), timeout=60, what=back.log)
                time.sleep(rng.uniform(0.0, 0.8))
                back.kill9()
                since[name] = len(back.log())
                workers[name] = worker(name).start()
        want = expected_rows(plan)

        def late_sent_when_closed() -> bool:
            closed = {r["group_id"] for r in rows(folders, "groups")}
            return {e.group_id for e in plan.late} <= closed

        wait_for(late_sent_when_closed, timeout=180, interval=1.0, what="the timed-out groups")
        publish(base, [message(e) for e in plan.late])

        def all_rows() -> bool:
            for w in workers.values():
                assert w.alive(), w.log()[-3000:]
            return all(len(rows(folders, o)) >= sum(want[o].values()) for o in OUTPUTS)

        def missing() -> str:
            return "; ".join(
                f"{o}: {sorted(want[o] - Counter(row_key(o, r) for r in rows(folders, o)))[:3]}"
                for o in OUTPUTS
            )

        wait_for(all_rows, timeout=180, interval=1.0, what=missing)
        publish(base, [message(e) for e in plan.mismatched])  # every group has closed
        letters = len(plan.late) + len(plan.mismatched)
        dead = read_topic(
            base.kafka.bootstrap_servers, base.topics.dead_letters, count=letters, timeout=60
        )
    finally:
        for w in workers.values():
            w.stop()
    check_outputs(base, plan, folders, dead)


def check_outputs(base: Settings, plan: Plan, folders: dict[str, Path], dead: list[Any]) -> None:
    """Every copy of every record on the groups topic is the same record; every row of
    the five outputs in the folders is there once and is the plan's; the rollouts of
    another task are dead-lettered."""
    _, groups_topic = topic_names(base.worker.app_id)
    copies: dict[bytes, set[bytes]] = defaultdict(set)
    records = len(plan.members) + len(plan.late)
    for r in read_topic(base.kafka.bootstrap_servers, groups_topic, count=records, timeout=60):
        copies[r.key].add(r.value)
    versions = {key: len(values) for key, values in copies.items() if len(values) > 1}
    assert not versions, versions  # every copy of a record is the same record
    assert len(copies) == records
    want = expected_rows(plan)
    for output in OUTPUTS:
        got = Counter(row_key(output, r) for r in rows(folders, output))
        assert got == want[output], (output, got - want[output], want[output] - got)
    advantages = {}
    for row in rows(folders, "groups"):
        members = plan.members[row["group_id"]]
        assert row["rewards"] == [members[e] for e in row["episode_ids"]]
        for eid, a, b in zip(
            row["episode_ids"], row["advantages"], reference(row["rewards"]), strict=True
        ):
            assert abs(a - b) <= 1e-9
            advantages[eid] = a
        assert row["complete"] == plan.complete[row["group_id"]]
        assert row["duplicates"] <= plan.copies[row["group_id"]]  # never a replay's copy
    for row in rows(folders, "kto"):
        (_, eid) = row_key("kto", row)
        assert row["label"] == (advantages[eid] > 0), row
    reasons = Counter(header(d, "x-reason") for d in dead)
    mismatched = {d.key for d in dead if header(d, "x-reason") == "group_prompt_mismatch"}
    assert mismatched == {e.group_id.encode() for e in plan.mismatched if e.group_id}, reasons
    late = Counter(d.value for d in dead if header(d, "x-reason") == "late_rollout")
    assert {message(e)[1] for e in plan.late} <= late.keys(), reasons


def test_every_group_output_once_while_a_third_worker_joins_and_leaves(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """Issue 36 item 2b: no kill, partitions moving between live workers only. Two
    workers and a third that joins, and leaves by SIGTERM, four times while the
    groups are produced; each with an output folder of its own, where the README
    promises exactly once for a clean rebalance: every row of every output, late
    ones included, is in one folder once, and each kto label is its advantage's."""
    folders = {name: tmp_path / f"out-{name}" for name in ("w1", "w2", "w3")}
    # Six partitions: Faust's assignor gives each of three workers two (of four,
    # the third would get none and nothing would move).
    churn = (*SETTINGS, "topics.partitions=6")
    base = settings_for(*churn)

    def worker(name: str) -> Worker:
        member = fleet_member(name, tmp_path, folders[name])
        return Worker(settings_for(*churn, *member), tmp_path / f"{name}.log")

    rng = random.Random(36)
    plan = make_plan(rng, 100, 9, time.time())
    publish(base, [message(e) for e in plan.waves[0]])
    workers = {"w1": worker("w1").start(), "w2": worker("w2").start()}
    since = {"w1": 0, "w2": 0, "w3": 0}
    started = dict(since)
    late = False
    try:
        for n, wave in enumerate(plan.waves[1:]):
            wait_for(
                lambda: all(ready(w, started[name], since[name]) for name, w in workers.items()),
                timeout=60,
                what=lambda: "\n".join(w.log()[-2000:] for w in workers.values()),
            )
            if n % 2 == 0:  # the third joins
                log = tmp_path / "w3.log"
                since["w3"] = started["w3"] = (
                    len(log.read_text(errors="replace")) if log.exists() else 0
                )
                workers["w3"] = worker("w3").start()
            else:  # and leaves; its partitions move once its session expired
                assert workers.pop("w3").stop() == 0
                since.update({name: len(w.log()) for name, w in workers.items()})
            publish(base, [message(e) for e in wave])
            closed = {r["group_id"] for r in rows(folders, "groups")}
            if not late and {e.group_id for e in plan.late} <= closed:
                publish(base, [message(e) for e in plan.late])
                late = True
        want = expected_rows(plan)

        def all_rows() -> bool:
            return all(len(rows(folders, o)) >= sum(want[o].values()) for o in OUTPUTS)

        wait_for(all_rows, timeout=90, interval=1.0, what="every row")
        assert late  # the late rollouts came while the workers changed
        publish(base, [message(e) for e in plan.mismatched])
        letters = len(plan.late) + len(plan.mismatched)
        dead = read_topic(
            base.kafka.bootstrap_servers, base.topics.dead_letters, count=letters, timeout=60
        )
    finally:
        codes = [w.stop() for w in workers.values()]
    assert codes == [0] * len(codes)
    check_outputs(base, plan, folders, dead)
