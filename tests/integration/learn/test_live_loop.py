"""The live loop, end to end, as docs/live-loop.md runs it: `stream-export learn`
(agents on the official OpenAI SDK; the reference trainer in the trainers
environment) through a real gateway with the weight fence, to the session's own vLLM
in dev mode, with a real worker closing groups. The tiny model learns the toy task
(reward 1 when a digit is among the first four completion tokens) while the trainer,
the worker and the gateway are each killed with -9 twice, at different moments: the
trainer between a fence's begin and its commit and again after an acknowledgement,
the worker after an acknowledgement and during a fence, the gateway with episodes
open and during a fence."""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from stream_export.contract.decoding import decode_event
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step
from stream_export.contract.groups import GroupRecord
from stream_export.contract.topics import topic_names
from stream_export.kafka import topics
from stream_export.settings import Settings
from stream_export.trainers.collate import version_number
from stream_export.weights.topic import ControlTopic
from tests.support.gateway_agent import base
from tests.support.monitoring import free_port, get
from tests.support.processes import Gateway, Worker, settings_args, trainer_pythons
from tests.support.topic_reader import committed_offsets, end_offsets, read_topic
from tests.support.vllm_server import VllmServer
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

GROUPS_PER_STEP, GROUP_SIZE, MAX_FEED_LAG = 4, 8, 4
#: A step's worth of rollouts on the steps topic (three events each: start, call, end):
#: the rollouts played while the worker is down (killed) are bounded by it.
MAX_CONSUMER_LAG = 3 * GROUP_SIZE * GROUPS_PER_STEP
#: docs/live-loop.md's bound: ceil((max_feed_lag + max_consumer_lag / (3 * group size)
#: + groups per step) / groups per step), counted from the newest version that served
#: each group, over whole batches.
STALENESS_BOUND = math.ceil(
    (MAX_FEED_LAG + MAX_CONSUMER_LAG / (3 * GROUP_SIZE) + GROUPS_PER_STEP) / GROUPS_PER_STEP
)
#: The same bound when batches were cut short: a step takes at least one group.
SHORT_BATCHES_BOUND = MAX_FEED_LAG + MAX_CONSUMER_LAG // (3 * GROUP_SIZE) + GROUPS_PER_STEP


def ledger(state: Path) -> list[dict[str, Any]]:
    path = state / "ledger.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def version(state: Path) -> int:
    """The newest version in the ledger (appended before its fence)."""
    entries = ledger(state)
    return int(entries[-1]["version"]) if entries else 0


def acknowledged(state: Path) -> int:
    """The newest version whose step line is in the trainer's log (printed once its
    batch was acknowledged)."""
    path = state / "trainer.log"
    text = path.read_text(errors="replace") if path.exists() else ""
    lines = [line for line in text.splitlines() if line.startswith('{"waited_s"')]
    return max(
        (int(json.loads(line)["version"]) for line in lines if line.endswith("}")), default=0
    )


def gauge(settings: Settings, name: str) -> float | None:
    """A gateway gauge (None while the gateway does not answer)."""
    status, body = get(base(settings) + "/metrics", timeout=2)
    found = [line for line in body.decode().splitlines() if line.startswith(name + " ")]
    return float(found[0].rsplit(" ", 1)[1]) if status == 200 and found else None


def throttled(settings: Settings) -> float:
    """Calls the gateway answered 429 since it started (a lag over its bound)."""
    status, body = get(base(settings) + "/metrics", timeout=2)
    prefix = 'stream_export_gateway_calls_total{endpoint="chat",outcome="throttled"} '
    found = [line for line in body.decode().splitlines() if line.startswith(prefix)]
    return float(found[0].removeprefix(prefix)) if status == 200 and found else 0.0


def fenced(settings: Settings) -> bool:
    return gauge(settings, "stream_export_gateway_fenced") == 1


def open_fence(settings: Settings) -> Any:
    """The version of the fence open on the control topic (None: none is)."""

    async def read() -> Any:
        topic = ControlTopic(settings, "test")
        await topic.start()
        try:
            await topic.catch_up(30)
            fence = topic.state.open_fence
            return None if fence is None else fence.version
        finally:
            await topic.close()

    return asyncio.run(read())


def groups_closed(settings: Settings) -> list[GroupRecord]:
    """Every record on the groups topic."""
    groups_topic = topic_names(settings.worker.app_id)[1]
    bootstrap, partitions = settings.kafka.bootstrap_servers, settings.topics.partitions
    count = sum(end_offsets(bootstrap, groups_topic, partitions).values())
    records = read_topic(bootstrap, groups_topic, count=count, timeout=30)
    return [msgspec.json.decode(r.value, type=GroupRecord) for r in records]


def played(settings: Settings) -> dict[str, set[str]]:
    """group id: the episodes of it that the gateway ended (from the steps topic)."""
    steps = read_topic(settings.kafka.bootstrap_servers, settings.topics.steps, count=1, timeout=30)
    events = [decode_event(r.value) for r in steps if r.value]  # markers have no value
    group_of = {e.episode_id: e.group_id for e in events if isinstance(e, EpisodeStart)}
    ended: dict[str, set[str]] = defaultdict(set)
    for e in events:
        group = group_of.get(e.episode_id) if isinstance(e, EpisodeEnd) else None
        if group is not None:
            ended[group].add(e.episode_id)
    return ended


@pytest.mark.timeout(600)  # the loop alone may take 300 s on a loaded machine
def test_the_live_loop_learns_while_the_trainer_the_worker_and_a_gateway_are_killed(
    settings_for: Any, reloadable_vllm: VllmServer, unique: Any, tmp_path: Path
) -> None:
    python = trainer_pythons()["trainers"]
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
        f"gateway.max_consumer_lag={MAX_CONSUMER_LAG}",
        "gateway.retry_after_s=1",
    )
    asyncio.run(topics.ensure(settings))
    state = tmp_path / "learn"
    command = [
        sys.executable, "-m", "stream_export", "learn",
        "--model", str(reloadable_vllm.model_dir), "--vllm", reloadable_vllm.url,
        "--state-dir", str(state), "--feed-group", feed_group,
        "--groups-per-step", str(GROUPS_PER_STEP), "--group-size", str(GROUP_SIZE),
        "--trainer-python", python, "--seed", "1",
        *settings_args(settings),
    ]  # fmt: skip
    worker = Worker(settings, tmp_path / "worker.log").start()
    gateway = Gateway(settings, tmp_path / "gateway.log").start()
    out = (tmp_path / "learn.out").open("wb")
    # a process group of its own: the command and its trainer child end together
    learn = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    began = time.monotonic()
    timeline: list[str] = []

    def logs() -> str:
        tail = (state / "trainer.log").read_text(errors="replace")[-3000:]
        return f"{(tmp_path / 'learn.out').read_text()[-3000:]}\ntrainer:\n{tail}"

    def when(what: str, check: Callable[[], object]) -> int:
        """Wait until ``check`` holds (the loop still running); the ledger's version."""
        wait_for(
            lambda: learn.poll() is not None or check(),
            timeout=120,
            what=lambda: f"{what}\n{logs()}",
        )
        assert learn.poll() is None, f"the loop ended before {what}\n{logs()}"
        return version(state)

    def killed(who: str, moment: str) -> None:
        timeline.append(f"{time.monotonic() - began:6.1f} s v{version(state)}: {who} {moment}")

    def kill_trainer() -> int:
        pid = int((state / "trainer.pid").read_text())
        os.kill(pid, signal.SIGKILL)
        return pid

    try:
        wait_for(lambda: get(base(settings) + "/healthz")[0] == 200, timeout=60, what="gateway")
        # 1. the trainer between its fence's begin and commit (its step in the ledger,
        # its batch not acknowledged); a kill that came after the commit is one more
        # kill, and the next fence is tried (the command restarts the trainer)
        dead: set[int] = set()
        for _ in range(3):
            at = when(
                "a fence for a stepped version",
                lambda: (
                    version(state) >= 2
                    and int((state / "trainer.pid").read_text()) not in dead
                    and version(state) > acknowledged(state)
                    and fenced(settings)
                ),
            )
            dead.add(kill_trainer())
            killed("trainer", "during a fence")
            if open_fence(settings) == at:
                break
        assert open_fence(settings) == at, f"no trainer kill landed in a fence: {timeline}"
        # 2. a gateway with episodes open, no fence
        at = when(
            "episodes open after the trainer's restart",
            lambda: (
                version(state) > at
                and not fenced(settings)
                and (gauge(settings, "stream_export_gateway_open_episodes") or 0) > 0
            ),
        )
        gateway.kill9()
        killed("gateway", "with episodes open")
        gateway = Gateway(settings, tmp_path / "gateway.log").start()
        # 3. the worker just after an acknowledgement
        at = when("a step after the gateway's restart", lambda: acknowledged(state) > at)
        worker.kill9()
        killed("worker", "after an acknowledgement")
        worker = Worker(settings, tmp_path / "worker.log").start()
        # 4. the trainer just after an acknowledgement: between two steps
        at = when(
            "a step after the worker's restart",
            lambda: acknowledged(state) > at and acknowledged(state) == version(state),
        )
        kill_trainer()
        killed("trainer", "after an acknowledgement")
        # 5. a gateway during a fence (holding calls)
        at = when(
            "a fence after the trainer's restart", lambda: version(state) > at and fenced(settings)
        )
        gateway.kill9()
        killed("gateway", "during a fence")
        gateway = Gateway(settings, tmp_path / "gateway.log").start()
        # 6. the worker during a fence
        at = when(
            "a fence after the gateway's restart", lambda: version(state) > at and fenced(settings)
        )
        refused = throttled(settings)
        worker.kill9()
        killed("worker", "during a fence")
        # its rollouts pile up on the steps topic, in no group the feed's lag counts:
        # the gateway holds the agents once the worker lags max_consumer_lag events
        when(
            "the gateway throttling the agents while the worker is down",
            lambda: (
                (gauge(settings, "stream_export_gateway_consumer_lag") or 0) > MAX_CONSUMER_LAG
                and throttled(settings) > refused
            ),
        )
        killed("worker", "restarted once the gateway throttled calls")
        worker = Worker(settings, tmp_path / "worker.log").start()
        assert learn.wait(timeout=300) == 0, logs()
        timeline.append(f"{time.monotonic() - began:6.1f} s v{version(state)}: the loop ended")
        # no rollout lost on the way to the trainer: every group whose rollouts all
        # ended at the gateway is closed, whole, on the groups topic
        ended = played(settings)
        whole = {g for g, episodes in ended.items() if len(episodes) == GROUP_SIZE}
        wait_for(
            lambda: whole <= {r.group_id for r in groups_closed(settings)},
            timeout=60,
            what=lambda: f"groups {whole - {r.group_id for r in groups_closed(settings)}}",
        )
    finally:
        print("kills:", *timeline, sep="\n  ", file=sys.stderr)
        with contextlib.suppress(ProcessLookupError):  # its trainer too, if still running
            os.killpg(learn.pid, signal.SIGKILL)
        learn.wait()
        out.close()
        worker.stop()
        gateway.stop()
    assert logs().count("restarting") >= 2, logs()

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
    # each restart resumed from the last checkpoint: every version stepped once, in order
    assert [e["version"] for e in entries if e["stepped"]] == list(range(1, final + 1))

    # every call recorded with the integer version that served it, one the trainer loaded
    steps = read_topic(settings.kafka.bootstrap_servers, settings.topics.steps, count=1, timeout=30)
    events = [decode_event(r.value) for r in steps if r.value]  # markers have no value
    calls = [e.call for e in events if isinstance(e, Step) and e.call is not None]
    served = Counter(call.weight_version for call in calls)
    assert set(served) <= set(range(final + 1)), served

    # no rollout lost, none trained twice: each group record on the topic before the
    # feed's acknowledgement is in the ledger exactly once, and the ledger holds no other;
    # each group is whole, and no rollout is in two groups
    groups_topic = topic_names(settings.worker.app_id)[1]
    ends = end_offsets(settings.kafka.bootstrap_servers, groups_topic, settings.topics.partitions)
    records = read_topic(
        settings.kafka.bootstrap_servers, groups_topic, count=sum(ends.values()), timeout=30
    )
    acked = committed_offsets(settings.kafka.bootstrap_servers, feed_group, groups_topic)
    decoded = [(r, msgspec.json.decode(r.value, type=GroupRecord)) for r in records]
    published = {g.record_id for _, g in decoded}
    before_ack = {g.record_id for r, g in decoded if r.offset < acked.get(r.partition, 0)}
    trained = Counter(rid for e in entries for rid in e["records"])
    assert max(trained.values()) == 1
    assert set(trained) <= published
    assert before_ack <= set(trained), before_ack - set(trained)
    groups = {g.record_id: g for _, g in decoded}
    assert all(g.complete and g.size == GROUP_SIZE and not g.duplicates for g in groups.values())
    rollouts = Counter(e.episode_id for g in groups.values() for e in g.rollouts)
    assert max(rollouts.values()) == 1, [e for e, n in rollouts.items() if n > 1]

    # staleness (docs/live-loop.md): a step trains on version t - 1 (t its entry's
    # version); from the newest version that served each of its groups, the bound
    # holds while the batches stepped since then were whole (a short one takes a version
    # for fewer groups). A group held open across versions (its last call refused
    # a while) has older first rollouts: the trainer's own staleness counts them.
    def newest(record_id: str) -> int:
        versions = [e.tokens.weight_version_max for e in groups[record_id].rollouts if e.tokens]
        return max(version_number(v) for v in versions)

    sizes = {e["version"]: len(e["records"]) for e in entries if e["stepped"]}
    checked: dict[int, tuple[int, int]] = {}
    every: dict[int, int] = {}
    for entry in (e for e in entries if e["stepped"]):
        t = entry["version"]
        last = min(newest(r) for r in entry["records"])
        every[t] = t - 1 - last
        if all(sizes[v] == GROUPS_PER_STEP for v in range(last + 1, t + 1)):
            checked[t] = (t - 1 - last, entry["staleness"])
    assert len(checked) >= len(sizes) // 2, (checked, sizes)
    assert max(fresh for fresh, _ in checked.values()) <= STALENESS_BOUND, checked
    assert max(every.values()) <= SHORT_BATCHES_BOUND, (every, sizes)
