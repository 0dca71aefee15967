"""A broker outage with a real worker: the tests' own broker, stopped for ~35 s and
started again on the same port and state folder. While it is away the worker
logs a few lines per cause per 10 s, uses little CPU, turns /readyz 503 with
kafka_reachable=false, and stops within the README's 10 s of SIGTERM, with traffic in
flight too; after it returns, every episode, sent before, around and after the outage
(and every group), is written exactly once."""

from __future__ import annotations

import asyncio
import json
import os
import re
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.client import AIOKafkaClient

from stream_export.contract.decoding import encode
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step, StepEvent
from stream_export.kafka import topics
from stream_export.kafka.connection import METADATA_RETRY_BACKOFF_MS
from stream_export.ops import health
from stream_export.output.follow import Follower
from stream_export.runtime.app import create_app
from stream_export.settings import Settings, load
from tests.support.monitoring import free_port, get
from tests.support.own_broker import Broker
from tests.support.processes import Worker
from tests.support.producer import produce
from tests.support.sinkkafka import prompts
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

OUTAGE_S = 35.0
#: /readyz must be 503 this soon after the broker went away.
UNREADY_WITHIN_S = health.UNREACHABLE_AFTER_S + 2 * health.PROBE_INTERVAL_S
#: Lines per cause (message with numbers masked) per started 10 s of outage.
LINES_PER_CAUSE_PER_10S = 2
MAX_CPU_SHARE = 0.15
#: Retries dropped per 10 s for the coordinator lookups and fetches of the two
#: group consumers (Faust's and the sink's): one a second each is 20; aiokafka's
#: default backoff would drop about 200.
MAX_RETRIES_PER_10S = 30
#: The README's bound on the exit after SIGTERM during an outage.
SIGTERM_EXIT_S = 10.0
STEPS = 3
#: How long the metadata test asks for refreshes without the broker.
REFRESHING_S = 3.0
#: Open episodes are due ~11 s after their last event; after 3 s of silence the
#: worker sends control ticks to close them on the wall clock.
DUE_IN_THE_OUTAGE = (
    "assemble.idle_timeout_s=10",
    "assemble.grace_s=1",
    "assemble.quiet_partition_s=3",
)


@pytest.fixture
def broker(own_broker: Broker) -> Broker:
    """The tests' own broker (tests/support/own_broker.py): these stop it."""
    return own_broker


def settings(broker: Broker, tmp: Path, *extra: str) -> Settings:
    token = uuid.uuid4().hex[:10]
    return load(
        env={},
        overrides=[
            f"kafka.bootstrap_servers={broker.address}",
            f"topics.steps=o-{token}-steps",
            f"topics.episodes=o-{token}-episodes",
            f"topics.dead_letters=o-{token}-dlq",
            "topics.partitions=2",
            f"worker.app_id=o-{token}-app",
            "worker.worker_id=outage-w",
            f"worker.data_dir={tmp / 'state'}",
            f"sink.output_dir={tmp / 'out'}",
            "http.enabled=true",
            f"http.port={free_port()}",
            *extra,
        ],
    )


def beginning(i: int) -> list[StepEvent]:
    """Start and all steps of episode ``i`` (prompt ``task i``), without its end."""
    eid, now = f"ep-{i}", time.time()
    events: list[StepEvent] = [
        EpisodeStart(episode_id=eid, time=now, agent_id="a", prompt=f"task {i}")
    ]
    events += [
        Step(episode_id=eid, time=now, seq=n, kind="thought", content=f"s{n}") for n in range(STEPS)
    ]
    return events


def ending(i: int) -> list[StepEvent]:
    return [EpisodeEnd(episode_id=f"ep-{i}", time=time.time(), steps=STEPS, outcome="success")]


def send(s: Settings, events: list[StepEvent]) -> None:
    messages = [(e.episode_id.encode(), encode(e)) for e in events]
    asyncio.run(produce(s.kafka.bootstrap_servers, s.topics.steps, messages))


def episodes(first: int, last: int) -> list[StepEvent]:
    return [e for i in range(first, last) for e in beginning(i) + ending(i)]


def url(s: Settings, path: str) -> str:
    return f"http://127.0.0.1:{s.http.port}{path}"


def readyz(s: Settings) -> tuple[int, dict[str, object]]:
    status, body = get(url(s, "/readyz"))
    return status, json.loads(body) if body else {}


def unready(s: Settings) -> dict[str, object] | None:
    """The /readyz document when it is 503, else None."""
    status, body = readyz(s)
    return body if status == 503 else None


def wait_written(s: Settings, count: int, worker: Worker, timeout: float) -> None:
    out = Path(s.sink.output_dir)
    wait_for(
        lambda: sum(prompts(out).values()) >= count,
        timeout=timeout,
        what=f"{count} records\n{worker.log()[-3000:]}",
    )


def assert_once(s: Settings, count: int) -> None:
    assert prompts(Path(s.sink.output_dir)) == Counter(f"task {i}" for i in range(count))


def cpu_seconds(worker: Worker) -> float:
    assert worker.proc is not None
    fields = Path(f"/proc/{worker.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ready(s: Settings, worker: Worker) -> None:
    wait_for(lambda: readyz(s)[0] == 200, timeout=90, what=f"ready\n{worker.log()[-3000:]}")


def before_outage(s: Settings, log: Path) -> Worker:
    """A ready worker that wrote episodes 0-99 and holds 100-149 open."""
    asyncio.run(topics.ensure(s))
    worker = Worker(s, log).start()
    ready(s, worker)
    send(s, episodes(0, 100) + [e for i in range(100, 150) for e in beginning(i)])
    wait_written(s, 100, worker, timeout=60)
    return worker


def after_outage(s: Settings, worker: Worker, count: int) -> None:
    """Send the ends of the open episodes (late if they timed out), new episodes up
    to ``count``; wait for all and stop."""
    send(s, [e for i in range(100, 150) for e in ending(i)] + episodes(150, count))
    wait_written(s, count, worker, timeout=90)
    assert worker.stop() == 0


def causes(lines: list[str]) -> Counter[str]:
    """Log lines by cause: level, logger and message with numbers and counts masked."""
    found: Counter[str] = Counter()
    for line in lines:
        text = line.split(" ", 1)[-1].split(" suppressed=")[0]
        found[re.sub(r"\d+", "N", text)] += 1
    return found


def test_an_outage_is_quiet_cheap_unready_and_loses_nothing(broker: Broker, tmp_path: Path) -> None:
    s = settings(broker, tmp_path)
    worker = before_outage(s, tmp_path / "worker.log")
    try:
        lines_before, cpu_before = len(worker.log().splitlines()), cpu_seconds(worker)
        began = time.monotonic()
        broker.stop()
        body = wait_for(
            lambda: unready(s), timeout=UNREADY_WITHIN_S, what=f"/readyz 503 in {UNREADY_WITHIN_S}s"
        )
        unready_after = time.monotonic() - began
        assert body is not None and body["checks"] == {
            "partitions_assigned": True,
            "state_recovered": True,
            "output_writable": True,
            "kafka_reachable": False,
            "uploads_flowing": True,
        }
        wait_for(lambda: time.monotonic() - began >= OUTAGE_S, timeout=OUTAGE_S, interval=1)
        assert unready(s) and worker.alive()
        outage = time.monotonic() - began
        cpu = cpu_seconds(worker) - cpu_before
        during = worker.log().splitlines()[lines_before:]
        broker.start()
        back = time.monotonic()
        ready(s, worker)
        ready_again = time.monotonic() - back
        after_outage(s, worker, 250)
    finally:
        worker.stop()
    assert_once(s, 250)
    per_cause = causes(during)
    allowed = LINES_PER_CAUSE_PER_10S * -(-outage // 10)
    print(
        f"outage {outage:.1f}s: {len(during)} lines ({len(during) / outage:.2f}/s), "
        f"CPU {cpu:.2f}s ({cpu / outage:.1%} of a core); 503 after {unready_after:.1f}s, "
        f"200 {ready_again:.1f}s after the broker was back; causes: {dict(per_cause)}"
    )
    assert max(per_cause.values()) <= allowed, per_cause
    retries = [
        int(m.group(1))
        for line in during
        if "Group Coordinator Request failed" in line or "Failed fetch messages" in line
        if (m := re.search(r" suppressed=(\d+)", line))
    ]
    assert retries and max(retries) <= MAX_RETRIES_PER_10S, retries
    assert cpu < MAX_CPU_SHARE * outage


def test_metadata_refreshes_back_off_while_the_broker_is_away(
    broker: Broker, tmp_path: Path
) -> None:
    """aiokafka's producer (for a partition whose leader it has as unknown: a metadata
    answer during the broker's shutdown) and its fetcher ask for a metadata refresh
    again as soon as one fails, and without the broker one fails at once: a core
    spent for the whole outage. In a process that built the worker's app, a client
    waits METADATA_RETRY_BACKOFF_MS after a failed refresh."""
    create_app(settings(broker, tmp_path))

    async def refreshes() -> tuple[int, float]:
        """Refreshes and CPU seconds in REFRESHING_S without the broker."""
        client = AIOKafkaClient(bootstrap_servers=broker.address)
        await client.bootstrap()
        try:
            await asyncio.to_thread(broker.stop)
            count, began, cpu = 0, time.monotonic(), time.process_time()
            while time.monotonic() - began < REFRESHING_S:  # as aiokafka's sender does
                assert await client.force_metadata_update() is False
                count += 1
            return count, time.process_time() - cpu
        finally:
            await client.close()

    count, cpu = asyncio.run(refreshes())
    print(f"{count} metadata refreshes, CPU {cpu:.2f}s in {REFRESHING_S:.0f}s without the broker")
    assert cpu < MAX_CPU_SHARE * REFRESHING_S
    # Unpaced: thousands. Paced: the first at once, then one per pause (and one for
    # the timers' granularity).
    assert 1 <= count <= REFRESHING_S / (METADATA_RETRY_BACKOFF_MS / 1000) + 2


def test_sigterm_during_an_outage_exits_quickly_and_a_restart_loses_nothing(
    broker: Broker, tmp_path: Path
) -> None:
    # The open episodes are due in the outage: control ticks for their quiet
    # partitions wait in the producer for the broker when SIGTERM comes.
    s = settings(broker, tmp_path, *DUE_IN_THE_OUTAGE)
    worker = before_outage(s, tmp_path / "worker.log")
    try:
        broker.stop()
        wait_for(lambda: unready(s), timeout=UNREADY_WITHIN_S, what="/readyz 503")
        wait_for(
            lambda: "aiokafka.producer.sender: Got error produce response" in worker.log(),
            timeout=30,
            what=f"ticks waiting for the broker\n{worker.log()[-3000:]}",
        )
        began = time.monotonic()
        code = worker.stop(timeout=SIGTERM_EXIT_S)
        exited = time.monotonic() - began
        print(f"SIGTERM during the outage: exit code {code} after {exited:.1f}s")
        assert code == 0, worker.log()[-3000:]
        broker.start()
        ready(s, worker.start())
        after_outage(s, worker, 200)
    finally:
        worker.stop()
    assert_once(s, 200)


def group_rows(out: Path) -> Counter[str]:
    """How often each group id appears among the committed group rows under ``out``."""
    rows = Follower(out, "training-data.groups", wait=False)
    return Counter(json.loads(line)["group_id"] for line in rows)


class Traffic(threading.Thread):
    """Agents sending episodes two rollouts to a group, a batch at a time, until the
    broker stops answering: ``acked`` holds the episode numbers whose every event
    the broker acknowledged (accepted: they must be written), ``tried`` all."""

    BATCH = 20

    def __init__(self, s: Settings) -> None:
        super().__init__(daemon=True)
        self.s = s
        self.acked: set[int] = set()
        self.tried = 0

    def run(self) -> None:
        asyncio.run(self._send())

    def events(self, i: int) -> list[StepEvent]:
        eid, now, group = f"ep-{i}", time.time(), f"g-{i // 2}"
        return [
            EpisodeStart(
                episode_id=eid,
                time=now,
                agent_id="a",
                prompt=f"task {i}",
                group_id=group,
                group_size=2,
            ),
            Step(episode_id=eid, time=now, seq=0, kind="thought", content="s0"),
            EpisodeEnd(episode_id=eid, time=now, steps=1, outcome="success", reward=i % 2),
        ]

    async def _send(self) -> None:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.s.kafka.bootstrap_servers,
            acks="all",
            linger_ms=5,
            request_timeout_ms=3000,
        )
        await producer.start()
        try:
            while True:
                batch = range(self.tried, self.tried + self.BATCH)
                self.tried += self.BATCH
                sent = {
                    i: [
                        await producer.send(
                            self.s.topics.steps, encode(e), key=e.episode_id.encode()
                        )
                        for e in self.events(i)
                    ]
                    for i in batch
                }
                for i, futures in sent.items():
                    done = await asyncio.gather(*futures, return_exceptions=True)
                    if not any(isinstance(d, BaseException) for d in done):
                        self.acked.add(i)
                if len(self.acked) < self.tried:
                    return  # the broker went away
                await asyncio.sleep(0.05)
        finally:
            try:
                async with asyncio.timeout(5):
                    await producer.stop()
            except TimeoutError:
                pass


def test_sigterm_during_an_outage_with_traffic_in_flight_exits_in_time_and_loses_nothing(
    broker: Broker, tmp_path: Path
) -> None:
    """Every stage busy (assembler, sinks, groups) when the broker goes: the worker
    still stops within the README's bound, and a restart writes every accepted
    episode and every group of two accepted rollouts exactly once."""
    # Each rollout has a prompt of its own ("task i": counted once each), so a group
    # takes mixed prompts.
    s = settings(broker, tmp_path, "groups.enabled=true", "groups.mixed_prompts=allow")
    asyncio.run(topics.ensure(s))
    out = Path(s.sink.output_dir)
    worker = Worker(s, tmp_path / "worker.log").start()
    traffic = Traffic(s)
    try:
        ready(s, worker)
        traffic.start()
        wait_for(
            lambda: group_rows(out).total() >= 50,
            timeout=60,
            what=f"groups written under traffic\n{worker.log()[-3000:]}",
        )
        broker.stop()
        traffic.join(30)
        assert not traffic.is_alive() and len(traffic.acked) < traffic.tried
        began = time.monotonic()
        code = worker.stop(timeout=60)
        exited = time.monotonic() - began
        print(f"SIGTERM with traffic in flight: exit code {code} after {exited:.1f}s")
        assert code == 0 and exited <= SIGTERM_EXIT_S, (code, exited, worker.log()[-5000:])
        assert "were not acknowledged when it stopped" in worker.log()  # work was in flight
        broker.start()
        ready(s, worker.start())
        acked = traffic.acked
        groups = {i // 2 for i in acked if (i ^ 1) in acked}  # both rollouts accepted
        wait_written(s, len(acked), worker, timeout=90)
        wait_for(
            lambda: group_rows(out).total() >= len(groups),
            timeout=90,
            what=f"{len(groups)} group rows\n{worker.log()[-3000:]}",
        )
        assert worker.stop() == 0
    finally:
        worker.stop()
    written = prompts(out)
    assert max(written.values()) == 1
    assert (
        {f"task {i}" for i in acked} <= set(written) <= {f"task {i}" for i in range(traffic.tried)}
    )
    closed = group_rows(out)
    assert max(closed.values()) == 1
    assert {f"g-{g}" for g in groups} <= set(closed)
