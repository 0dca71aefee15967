"""The groups stage on the real broker under planted faults: a slow seek after
recovery, a crash between a closed marker and its open entry, a bug building one
group's record."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from stream_export.contract.decoding import encode
from stream_export.contract.episode import Episode
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step
from stream_export.contract.groups import GroupRecord
from stream_export.contract.topics import topic_names
from stream_export.groups.stage import CLOSED_TABLE, OPEN_TABLE
from stream_export.kafka import topics
from stream_export.settings import Settings
from tests.support.groups import SETTINGS, distinct_records, files, records, rollout
from tests.support.monitoring import free_port, get
from tests.support.processes import Worker
from tests.support.producer import produce
from tests.support.sinkkafka import message, publish
from tests.support.topic_reader import (
    EpisodeReader,
    committed_offsets,
    end_offsets,
    header,
    read_topic,
)
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


SLOW_SEEK = """
import asyncio
from stream_export.groups.regroup import Regroup
from stream_export.runtime.patches import consumer as adapter
_seek, _regroup = adapter.Consumer.perform_seek, Regroup.handle
async def perform_seek(self):
    await _seek(self)
    await asyncio.sleep(2.0)
async def regroup(self, partition, source, message):
    await asyncio.sleep(0.2)
    await _regroup(self, partition, source, message)
adapter.Consumer.perform_seek, Regroup.handle = perform_seek, regroup
"""


def test_rollouts_fetched_while_faust_seeks_after_recovery_are_handled(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """A worker restarted on an empty state directory recovers its open groups from
    the changelog while the rest of their rollouts wait on the episodes topic: every
    group still closes whole, though the fetcher has time to fetch them all before
    Faust's seek ends."""
    base = settings_for(*SETTINGS)
    now = time.time()
    want = {f"s{g:02d}": {f"s{g:02d}-r{i}" for i in range(4)} for g in range(12)}
    sent = [rollout(g, i, now + i, float(i % 2), 4) for g in want for i in range(4)]
    publish(base, [message(e) for e in sent if e.episode_id[-1] in "01"])
    changelog = f"{base.worker.app_id}-{OPEN_TABLE}-changelog"

    def worker(state: str, prelude: str | None = None) -> Worker:
        s = settings_for(*SETTINGS, f"worker.data_dir={tmp_path / state}")
        return Worker(s, tmp_path / f"{state}.log", prelude=prelude)

    with worker("first"):
        read_topic(base.kafka.bootstrap_servers, changelog, count=len(want), timeout=90)
    publish(base, [message(e) for e in sent if e.episode_id[-1] in "23"])
    with worker("second", SLOW_SEEK) as w:
        wait_for(
            lambda: want.keys() <= distinct_records(base),
            timeout=90,
            interval=1.0,
            what=lambda: f"the {len(want)} groups\n{w.log()[-3000:]}",
        )
    found = records(base, len(want), 10.0)
    assert found.keys() == want.keys()
    for group_id, copies in found.items():
        record = copies[0]
        assert (record.close_reason, record.complete) == ("size", True)
        assert {e.episode_id for e in record.rollouts} == want[group_id]


#: Planted in the worker: it dies (as by kill -9: no flush, no commit) right after a
#: persist has written closed markers, before it deletes those groups' open entries.
DIE_AFTER_MARKERS = """
import os
from stream_export.groups.stage import CLOSED_TABLE
from stream_export.groups.storage import CLOCK_KEY
from stream_export.runtime.tables import Changelog
_write = Changelog.write
async def write(self, writes):
    await _write(self, writes)
    keys = [k for items in writes.values() for k, _ in items]
    if self.table.name == CLOSED_TABLE and any(k != CLOCK_KEY for k in keys):
        os._exit(9)
Changelog.write = write
"""


def test_a_crash_between_a_groups_marker_and_its_open_entry_leaves_it_closed(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """Killed after writing closed markers, before deleting those groups' open
    entries: restarted, the worker holds them closed, not open as well (where they
    would wait for their timeout, 60 s, to be published again without their last
    rollouts), and every group is published whole: again only if its marker was
    not written yet, and then the same record (the sinks drop the repeat)."""
    port = free_port()
    s = settings_for(
        *SETTINGS,
        f"worker.data_dir={tmp_path / 'state'}",
        "http.enabled=true",
        f"http.port={port}",
    )
    now = time.time()
    want = {f"c{g}": {f"c{g}-r{i}" for i in range(4)} for g in range(8)}
    sent = [rollout(g, i, now + i, float(i % 2), 4) for g in want for i in range(4)]
    publish(s, [message(e) for e in sent if e.episode_id[-1] in "01"])
    changelog = f"{s.worker.app_id}-{OPEN_TABLE}-changelog"
    with Worker(s, tmp_path / "dying.log", prelude=DIE_AFTER_MARKERS) as dying:
        read_topic(s.kafka.bootstrap_servers, changelog, count=len(want), timeout=90)
        publish(s, [message(e) for e in sent if e.episode_id[-1] in "23"])
        wait_for(lambda: not dying.alive(), timeout=90, what="the worker to die on its markers")
    with Worker(s, tmp_path / "worker.log") as worker:
        out = Path(s.sink.output_dir)
        wait_for(
            lambda: len(files(out, "groups")) >= len(want),
            timeout=60,
            what=lambda: f"{len(want)} group rows\n{worker.log()[-3000:]}",
        )
        open_now: list[str] = []

        def none_open() -> bool:
            lines = get(f"http://127.0.0.1:{port}/metrics")[1].decode().splitlines()
            open_now[:] = [x for x in lines if x.startswith("stream_export_groups_open{")]
            return len(open_now) == 4 and all(x.endswith(" 0.0") for x in open_now)

        wait_for(none_open, timeout=20, what=lambda: f"no open group: {open_now}")
    found = records(s, len(want), 10.0)
    assert found.keys() == want.keys()
    for group_id, (record, *again) in found.items():
        assert (record.close_reason, record.complete) == ("size", True)
        assert {e.episode_id for e in record.rollouts} == want[group_id]
        # published again only where the crash came before its marker, and the same
        assert all(copy == record for copy in again), group_id
    assert sorted(r["group_id"] for r in files(out, "groups")) == sorted(want)


#: Planted in the worker: building the record of group "g-bug" fails (a bug).
BUG_IN_RECORD = """
from stream_export.groups import publish
_closed_record = publish.closed_record
def closed_record(group, *args):
    if group.group_id == "g-bug":
        raise ValueError("planted")
    return _closed_record(group, *args)
publish.closed_record = closed_record
"""


def test_a_group_whose_record_cannot_be_built_is_dead_lettered_and_the_worker_goes_on(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """A bug building one group's record costs that group only: a dead letter
    (reason internal_error) naming its rollouts, never a vanished group or a
    crashed worker; the next group is published."""
    settings = settings_for("groups.enabled=true")
    now = time.time()
    bug = [rollout("g-bug", i, now + i, float(i), 2) for i in range(2)]
    fine = [rollout("g-fine", i, now + 10 + i, float(i), 2) for i in range(2)]
    publish(settings, [message(e) for e in bug + fine])
    with Worker(settings, tmp_path / "worker.log", prelude=BUG_IN_RECORD) as worker:
        found = records(settings, 1, 60.0)
        letters = read_topic(
            settings.kafka.bootstrap_servers, settings.topics.dead_letters, count=1, timeout=60
        )
        assert worker.alive(), worker.log()[-3000:]
    assert set(found) == {"g-fine"}
    (letter,) = letters
    assert (header(letter, "x-reason"), letter.key) == ("internal_error", b"g-bug")
    summary = json.loads(letter.value)
    assert sorted(summary["episode_ids"]) == sorted(e.episode_id for e in bug)


#: A worker's log line once its groups stage has rebuilt the partitions it was given.
REBUILT = re.compile(r"open groups on partitions \[\d")
#: Planted in the worker: Faust commits offsets only while this file exists.
COMMITS_WHILE = """
import os
from stream_export.runtime.patches import consumer as adapter
_commit = adapter._ConsumerThread._commit
async def commit(self, offsets):
    return os.path.exists({flag!r}) and await _commit(self, offsets)
adapter._ConsumerThread._commit = commit
"""


def test_a_group_forgotten_before_a_crash_is_not_published_again_from_its_replay(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """Issue 36 item 1: a group closed whole, then forgotten (closed_retention_s of
    event time later); its last rollouts are after the committed offsets (commits
    lag the stored state). Killed and restarted, the worker replayed them onto a
    state without the group and opened it anew: its timeout published a second
    version under the same record id, with those rollouts only. Now the replay
    changes nothing, and the rollouts the regroup stage forwards again are late."""
    flag = tmp_path / "commits"
    flag.touch()
    s = settings_for(
        "topics.partitions=1",
        "groups.enabled=true",
        "groups.timeout_s=4",
        "groups.closed_retention_s=4",
        "assemble.idle_timeout_s=2.5",
        "assemble.grace_s=0.5",
        "assemble.quiet_partition_s=1",
        "assemble.persist_interval_s=0.2",
        "worker.store=rocksdb://",
    )
    bootstrap, app = s.kafka.bootstrap_servers, s.worker.app_id
    by_group, _ = topic_names(app)
    prelude = COMMITS_WHILE.format(flag=str(flag))

    def committed(topic: str, at: int) -> bool:
        return committed_offsets(bootstrap, app, topic).get(0, 0) >= at

    dying = Worker(s, tmp_path / "dying.log", prelude=prelude).start()
    try:
        wait_for(lambda: REBUILT.search(dying.log()), timeout=60, what=dying.log)
        # Ending 15 s ahead: the group times out 19 s from now, all four back by then.
        ends = time.time() + 15
        sent = [rollout("g", i, ends + i * 0.1, float(i % 2), 4) for i in range(4)]
        publish(s, [message(e) for e in sent[:2]])
        wait_for(lambda: committed(s.topics.episodes, 2), timeout=60, what=dying.log)
        forwarded = end_offsets(bootstrap, by_group, 1)[0]
        wait_for(lambda: committed(by_group, forwarded), timeout=60, what=dying.log)
        flag.unlink()  # the rest is handled and stored, never committed
        publish(s, [message(e) for e in sent[2:]])
        (first,) = wait_for(lambda: records(s, 1, 30.0).get("g", []), timeout=60, what=dying.log)
        changelog = f"{app}-{CLOSED_TABLE}-changelog"
        wait_for(
            lambda: any(
                r.key == b"g" and r.value is None
                for r in read_topic(bootstrap, changelog, count=1, timeout=10, settle=0.2)
            ),
            timeout=60,
            what=lambda: f"the group forgotten\n{dying.log()[-3000:]}",
        )
    finally:
        dying.kill9()
    flag.touch()
    late = {f"g/late/g-r{i}" for i in (2, 3)}  # forwarded again by the regroup stage
    found: dict[str, list[GroupRecord]] = {}

    def settled() -> bool:
        found.update(records(s, 1, 10.0))
        return late <= found.keys() or len(found["g"]) > 1

    with Worker(s, tmp_path / "worker.log", prelude=prelude) as worker:
        wait_for(settled, timeout=60, what=lambda: f"its records\n{worker.log()[-3000:]}")
    assert (first.close_reason, first.size) == ("size", 4)
    assert found["g"] == [first], [(r.close_reason, r.size) for r in found["g"]]
    assert late <= found.keys()


#: Planted in the worker: it dies (as by kill -9) at its assembler's first persist
#: after the episodes were delivered, before their closed markers are written.
DIE_BEFORE_EPISODE_MARKERS = """
import os
from stream_export.assemble.agent import CLOSED_TABLE
from stream_export.runtime.tables import Changelog
_write = Changelog.write
async def write(self, writes):
    if self.table.name == CLOSED_TABLE and os.path.exists({flag!r}):
        os.remove({flag!r})
        os._exit(9)
    await _write(self, writes)
Changelog.write = write
"""


def steps_of(episode: Episode) -> list[tuple[bytes, bytes]]:
    """The step events an agent sends for ``episode`` (a start, one step, an end)."""
    eid = episode.episode_id
    events: list[EpisodeStart | Step | EpisodeEnd] = [
        EpisodeStart(
            episode_id=eid,
            time=episode.start_time,
            agent_id="agent",
            prompt=episode.prompt,
            group_id=episode.group_id,
            group_size=episode.group_size,
        ),
        Step(episode_id=eid, time=episode.end_time, seq=0, kind="output", content="try"),
        EpisodeEnd(
            episode_id=eid,
            time=episode.end_time,
            steps=1,
            outcome=episode.outcome,
            reward=episode.reward,
        ),
    ]
    return [(eid.encode(), encode(e)) for e in events]


def test_episodes_the_assembler_publishes_again_after_a_kill_are_no_duplicates(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """Issue 36 item 3: killed after its assembler published two rollouts and before
    it marked them closed, a worker publishes them again when restarted (the same
    episodes, at other positions of the episodes topic): the crash's replay, not a
    copy. A copy another producer sends is one: the group counts exactly it."""
    flag = tmp_path / "die"
    flag.touch()
    s = settings_for(*SETTINGS, "topics.partitions=1")
    now = time.time()
    sent = [rollout("d", i, now + i, float(i % 2), 3) for i in range(3)]
    steps = [[m for e in part for m in steps_of(e)] for part in (sent[:2], sent[2:])]
    asyncio.run(topics.ensure(s))
    asyncio.run(produce(s.kafka.bootstrap_servers, s.topics.steps, steps[0]))
    dying = Worker(
        s, tmp_path / "dying.log", prelude=DIE_BEFORE_EPISODE_MARKERS.format(flag=str(flag))
    )
    dying.start()
    wait_for(lambda: not dying.alive(), timeout=90, what=dying.log)
    with Worker(s, tmp_path / "worker.log") as worker:
        reader = EpisodeReader(s.kafka.bootstrap_servers, s.topics.episodes)
        try:
            wait_for(lambda: reader.poll() and reader.messages >= 4, timeout=60, what=worker.log)
        finally:
            reader.close()
        publish(s, [message(sent[1])])  # another producer's copy
        asyncio.run(produce(s.kafka.bootstrap_servers, s.topics.steps, steps[1]))
        (record,) = wait_for(lambda: records(s, 1, 30.0).get("d", []), timeout=60, what=worker.log)
    assert (record.close_reason, record.size) == ("size", 3)
    assert record.duplicates == 1
