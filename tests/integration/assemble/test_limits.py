"""Values at every configured limit on the real broker, with kill -9 while they are
stored: events of exactly ``assemble.max_event_bytes``, an episode of exactly
``max_episode_bytes`` and one of exactly ``max_steps`` steps, groups of 16 large
rollouts, ids at their longest. The worker stays up, stores what it must in the
changelogs (whose records the broker bounds at its default 1 MB), and writes every
record once, whole; what the bounds refuse is dead-lettered with its reason."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from stream_export.contract.events import MAX_ID_LENGTH
from stream_export.kafka import topics
from stream_export.settings import Settings
from tests.support.processes import Worker
from tests.support.producer import produce
from tests.support.sinkfiles import all_lines
from tests.support.topic_reader import header, read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
NOW = time.time()
SETTINGS = (
    "worker.store=rocksdb://",
    "assemble.persist_interval_s=0.2",
    "assemble.idle_timeout_s=600",
)


def sized(event: dict[str, Any], size: int, field: str = "content") -> bytes:
    """``event`` as compact JSON of exactly ``size`` bytes, padded in ``field``."""
    bare = len(json.dumps({**event, field: ""}, separators=(",", ":")).encode())
    value = json.dumps({**event, field: "x" * (size - bare)}, separators=(",", ":")).encode()
    assert len(value) == size
    return value


def start(eid: str, **fields: Any) -> dict[str, Any]:
    return {"type": "start", "v": 1, "episode_id": eid, "time": NOW, "agent_id": "a", **fields}


def step(eid: str, seq: int) -> dict[str, Any]:
    return {"type": "step", "v": 1, "episode_id": eid, "time": NOW, "seq": seq, "kind": "output"}


def end(eid: str, steps: int, reward: float = 1.0) -> bytes:
    return json.dumps(
        {"type": "end", "v": 1, "episode_id": eid, "time": NOW + 1, "steps": steps}
        | {"outcome": "success", "reward": reward}
    ).encode()


def send(settings: Settings, values: Sequence[bytes]) -> None:
    """Step events to the steps topic, keyed by their episode id (up to 2 MiB each)."""
    keyed = [(json.loads(v)["episode_id"].encode(), v) for v in values]
    bootstrap, topic = settings.kafka.bootstrap_servers, settings.topics.steps
    asyncio.run(produce(bootstrap, topic, keyed, max_request_size=2 * MIB))


def records(out: Path, prefix: str = "training-data") -> dict[str, list[dict[str, Any]]]:
    found: dict[str, list[dict[str, Any]]] = {}
    for line in all_lines(out, prefix):
        row = json.loads(line)
        found.setdefault(row.get("episode_id") or row["group_id"], []).append(row)
    return found


def wait_rows(worker: Worker, out: Path, want: set[str], prefix: str = "training-data") -> None:
    def done() -> bool:
        assert worker.alive(), worker.log()[-3000:]
        try:
            return want <= records(out, prefix).keys()
        except AssertionError:  # read while a large record was being appended
            return False

    wait_for(done, timeout=120, interval=0.5, what=lambda: f"{sorted(want)[:4]} in {prefix}")


def test_events_and_episodes_at_their_limits_survive_kill9(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    s = settings_for(
        *SETTINGS,
        "assemble.max_steps=100000",
        "format.format=episode",
    )
    asyncio.run(topics.ensure(s))
    a = s.assemble
    big, full = "b" * MAX_ID_LENGTH, "f" * MAX_ID_LENGTH
    many = "many"  # 100,000 steps of a longer id would pass max_episode_bytes
    # big: one event of exactly max_event_bytes, stored before its end arrives;
    # full: events adding up to exactly max_episode_bytes; many: max_steps steps.
    opening = [json.dumps(start(big, prompt="big")).encode()]
    opening.append(sized(step(big, 0), a.max_event_bytes))
    first = json.dumps(start(full, prompt="full")).encode()
    closing = end(full, 16)
    rest = a.max_episode_bytes - len(first) - len(closing) - 15 * a.max_event_bytes
    opening += [first] + [sized(step(full, i), a.max_event_bytes) for i in range(15)]
    opening.append(sized(step(full, 15), rest))
    opening.append(json.dumps(start(many, prompt="many")).encode())
    opening += [json.dumps(step(many, i) | {"content": str(i)}).encode() for i in range(99_999)]
    assert sum(map(len, opening[2:19])) + len(closing) == a.max_episode_bytes
    send(s, opening)
    changelog = f"{s.worker.app_id}-assemble-open-changelog"
    with Worker(s, tmp_path / "first.log") as worker:
        # The 1 MiB event and the 16 MiB episode are in the changelog, in pieces.
        stored = read_topic(s.kafka.bootstrap_servers, changelog, count=40, timeout=120)
        assert worker.alive(), worker.log()[-3000:]
        worker.kill9()
    assert max(len(r.value or b"") for r in stored) < MIB
    send(s, [end(big, 1), closing, json.dumps(step(many, 99_999)).encode(), end(many, 100_000)])
    out = Path(s.sink.output_dir)
    with Worker(s, tmp_path / "second.log") as worker:
        wait_rows(worker, out, {big, full, many})
    found = records(out)
    assert {k: len(v) for k, v in found.items()} == {big: 1, full: 1, many: 1}
    (b,), (f,), (m,) = found[big], found[full], found[many]
    assert not b["truncated"] and b["steps"][0]["content"] == json.loads(opening[1])["content"]
    assert not f["truncated"]
    assert [x["content"] for x in f["steps"]] == [json.loads(v)["content"] for v in opening[3:19]]
    assert not m["truncated"] and len(m["steps"]) == 100_000
    assert [x["content"] for x in m["steps"][99_997:99_999]] == ["99997", "99998"]


def rollout(group: str, i: int, size: int, expected: int) -> list[bytes]:
    eid = f"{i:02d}" + group[2:]  # an id of the longest length too
    head = start(eid, prompt="task", group_id=group, group_size=expected)
    return [json.dumps(head).encode(), sized(step(eid, 0), size), end(eid, 1, float(i % 2))]


def test_groups_of_large_rollouts_survive_kill9_or_are_refused_whole(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """16 rollouts of ~80 KB (a realistic group) and 16 of ~1 MB (at the default
    bounds) make group rows, stored open across a kill -9; 17 of ~1 MB make a group
    record over assemble.max_record_bytes: a group_too_large dead letter, while each
    rollout is still written on its own."""
    s = settings_for(
        *SETTINGS, "groups.enabled=true", "groups.timeout_s=600", "format.metadata_mode=columns"
    )
    asyncio.run(topics.ensure(s))
    mib = s.assemble.max_event_bytes
    small = ("s" * MAX_ID_LENGTH, 80_000, 16)
    large = ("l" * MAX_ID_LENGTH, mib, 16)
    huge = ("h" * MAX_ID_LENGTH, mib, 17)
    plan = {g: [rollout(g, i, size, n) for i in range(n)] for g, size, n in (small, large, huge)}
    send(s, [v for g in plan for r in plan[g][:8] for v in r])
    changelog = f"{s.worker.app_id}-groups-open-changelog"
    with Worker(s, tmp_path / "first.log") as worker:
        # the three groups' 8 members and summaries are stored: 3 x 9 records at least
        stored = read_topic(s.kafka.bootstrap_servers, changelog, count=27, timeout=120)
        worker.kill9()
    assert max(len(r.value or b"") for r in stored) < MIB
    send(s, [v for g in plan for r in plan[g][8:] for v in r])
    out = Path(s.sink.output_dir)
    rollouts = {json.loads(r[0])["episode_id"] for g in plan for r in plan[g]}
    with Worker(s, tmp_path / "second.log") as worker:
        wait_rows(worker, out, {small[0], large[0]}, "training-data.groups")
        wait_rows(worker, out, rollouts)
        dead = read_topic(s.kafka.bootstrap_servers, s.topics.dead_letters, count=1, timeout=60)
        assert worker.alive()
    groups = records(out, "training-data.groups")
    assert groups.keys() == {small[0], large[0]}
    for g, _size, n in (small, large):
        (row,) = groups[g]
        assert row["size"] == n and row["complete"]
        assert sorted(row["completions"]) == sorted(json.loads(r[1])["content"] for r in plan[g])
    assert {k: len(v) for k, v in records(out).items()} == dict.fromkeys(rollouts, 1)
    assert [(header(r, "x-reason"), r.key) for r in dead] == [("group_too_large", huge[0].encode())]
