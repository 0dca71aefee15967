"""End-to-end latency: episodes produced at a steady rate while the real worker runs."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaProducer

from bench import BenchError
from bench.report import percentile
from bench.runs import Latency
from bench.systems import POLL_S, RealWorker
from stream_export.contract.decoding import decode_event, encode
from stream_export.contract.events import Step
from stream_export.settings import Settings
from tests.support.producer import produce
from tests.support.traffic import Plan


class _Id(msgspec.Struct):
    episode_id: str


_id_decoder = msgspec.json.Decoder(_Id)


#: The schedule starts this long after the messages are prepared.
_LEAD_S = 1.0


async def _steady(
    bootstrap: str, topic: str, plan: Plan, rate: float, completed: dict[str, float]
) -> None:
    """Send ``plan`` at ``rate`` messages/s; note when the last distinct event of
    each episode was sent.

    Each event is stamped with its scheduled send time and encoded before the
    schedule starts, so the sending loop does no more than aiokafka's ``send``:
    on two shared cores, a sender that decodes and encodes each message on the
    way takes a core of its own and the worker's latency then measures the
    contention.
    """
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=2, acks="all")
    await producer.start()
    parts: dict[str, set[tuple[str, int]]] = defaultdict(set)
    # preparing costs ~5 µs a small message and ~10 ns a byte of a large one
    size = sum(len(value) for _, value in plan.messages)
    start = time.time() + _LEAD_S + len(plan.messages) / 200_000 + size * 2e-8
    prepared: list[tuple[bytes, bytes, str | None]] = []
    whole: set[str] = set()
    for i, (key, value) in enumerate(plan.messages):
        event = msgspec.structs.replace(decode_event(value), time=start + i / rate)
        eid = event.episode_id
        seen = parts[eid]
        seen.add((type(event).__name__, event.seq if isinstance(event, Step) else -1))
        done = eid not in whole and len(seen) == plan.ended[eid] + 2
        if done:
            whole.add(eid)
        prepared.append((key, encode(event), eid if done else None))
    try:
        pending = []
        t0 = time.monotonic() + (start - time.time())
        for i, (key, value, completes) in enumerate(prepared):
            delay = t0 + i / rate - time.monotonic()
            if delay > 0.001:
                await asyncio.sleep(delay)
            pending.append(await producer.send(topic, value, key=key))
            if completes is not None:
                completed[completes] = time.time()
        await asyncio.gather(*pending)
    finally:
        await producer.stop()


async def _watch(worker: RealWorker, stop: Callable[[], bool]) -> None:
    while not stop():
        worker.done()
        if not worker.alive():
            raise BenchError("the worker stopped during the latency run")
        await asyncio.sleep(POLL_S)


def measure_latency(
    settings: Settings,
    log: Path,
    warmup: Plan,
    plan: Plan,
    rate: float,
    timeout: float,
    progress: Callable[[float], None],
    prelude: str | None = None,
    episode_of: Callable[[bytes], str] | None = None,
) -> Latency:
    """Start a worker (``prelude``: see tests.support.processes.Worker), wait until a warm-up
    episode comes out, then send ``plan`` at ``rate`` events/s and time each episode
    from its completing send to its first line (``episode_of``: the episode id of a
    line, by default decoded from its ``episode_id`` column)."""
    bootstrap, topic = settings.kafka.bootstrap_servers, settings.topics.steps
    expected = len(warmup.ended) + len(plan.ended)
    worker = RealWorker(settings, log, expected, prelude)
    seen_at: dict[str, float] = {}
    completed: dict[str, float] = {}

    def decode_id(line: bytes) -> str:
        return _id_decoder.decode(line).episode_id

    of = episode_of or decode_id

    def on_line(line: bytes) -> None:
        seen_at.setdefault(of(line), time.time())

    worker.on_line = on_line

    def wait(until: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            progress(worker.done())
            if not worker.alive():
                raise BenchError(f"the worker stopped while {what}")
            if time.monotonic() > deadline:
                raise BenchError(f"timed out after {timeout:.0f}s {what}")
            time.sleep(POLL_S)

    async def send_and_watch() -> None:
        sending = asyncio.create_task(_steady(bootstrap, topic, plan, rate, completed))
        watching = asyncio.create_task(_watch(worker, sending.done))
        await asyncio.gather(sending, watching)

    try:
        asyncio.run(produce(bootstrap, topic, warmup.messages))
        wait(lambda: worker.seen >= len(warmup.ended), "waiting for the warm-up episode")
        started = time.monotonic()
        asyncio.run(send_and_watch())
        seconds = time.monotonic() - started
        # an episode may make several records (token segments): wait for each episode
        wait(lambda: len(seen_at) >= expected, "waiting for the last episodes")
    finally:
        worker.stop()
    delays = [seen_at[eid] - completed[eid] for eid in plan.ended]
    return Latency(
        rate_events_per_s=rate,
        episodes=len(delays),
        seconds=seconds,
        p50_s=percentile(delays, 50),
        p90_s=percentile(delays, 90),
        p99_s=percentile(delays, 99),
        max_s=max(delays),
    )
