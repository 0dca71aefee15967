"""Produce step events from Python agents: an episode recorder over an idempotent producer.

Async::

    async with Producer("127.0.0.1:9092") as producer:
        async with producer.episode(agent_id="a1", prompt="You are in a dark room.") as ep:
            await ep.thought("I should check the door.")
            await ep.action("try opening the door", name="open_door")
            await ep.result("The door was unlocked.", name="open_door")
            await ep.end("success", reward=1.0)

Sync: the same with ``SyncProducer``, ``with`` and no ``await``.

The recorder (stream_export.client.recorder) numbers steps (seq 0, 1, 2, ...), stamps event
times and checks every event with the worker's own decoder before it leaves; the
producer keys it by episode id. Leaving the episode block with an exception ends the
episode as a failure; leaving it without ``end()`` ends it with outcome "other".

The producer is idempotent with acks=all and a short linger, flushes on exit, and
never blocks an agent forever: at most ``max_pending`` events wait for the broker,
and every wait is bounded by ``timeout_s``, after which KafkaUnavailableError says so.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import AsyncIterable, AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from types import TracebackType
from typing import Any, BinaryIO, Final, Generic, Literal, Self, TypeVar, Unpack

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, KafkaTimeoutError, ProducerClosed

from stream_export.client.recorder import (
    EpisodeFields,
    EpisodeRecorder,
    ScoreFields,
    SyncEpisodeRecorder,
    score_event,
)
from stream_export.contract.decoding import DEFAULT_MAX_EVENT_BYTES, decode_event, encode_event
from stream_export.contract.events import StepEvent
from stream_export.errors import DecodeError, KafkaUnavailableError, ProduceError, RecorderError
from stream_export.kafka.connection import kafka_options
from stream_export.settings import Settings
from stream_export.settings.topics import TopicSettings

log = logging.getLogger(__name__)

DEFAULT_TOPIC: Final = TopicSettings().steps
DEFAULT_TIMEOUT_S: Final = 30.0
#: Room for the key, headers and record-batch framing on top of the event itself.
_RECORD_OVERHEAD: Final = 64 * 1024

RecT = TypeVar("RecT")
T = TypeVar("T")


class _Producing(Generic[RecT]):
    """What both producers share: construction from settings and new episodes."""

    def __init__(
        self,
        bootstrap_servers: str = "127.0.0.1:9092",
        *,
        topic: str = DEFAULT_TOPIC,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_pending: int = 10_000,
        linger_ms: int = 5,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        **kafka: Any,
    ) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.topic = topic
        self.timeout_s = timeout_s
        self.max_pending = max_pending
        self.linger_ms = linger_ms
        self.max_event_bytes = max_event_bytes
        #: Extra aiokafka options (security, client id).
        self.kafka = kafka
        self._setup()

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> Self:
        """A producer for ``settings``: broker, security, steps topic and event size limit."""
        options: dict[str, Any] = {
            "topic": settings.topics.steps,
            "max_event_bytes": settings.assemble.max_event_bytes,
            **kafka_options(settings),
            **overrides,
        }
        return cls(options.pop("bootstrap_servers"), **options)

    def episode(self, **fields: Unpack[EpisodeFields]) -> RecT:
        """A recorder for a new episode (``agent_id``, ``prompt``, optional
        ``episode_id``, ``group_id``, ``group_size``, ``metadata``); ``start()`` it or
        use it as a context manager."""
        return self._recorder(fields)

    def score(self, episode_id: str, name: str, value: float, **fields: Unpack[ScoreFields]) -> Any:
        """Send a score for episode ``episode_id``, ended or not, recorded here or
        anywhere (see ``recorder.score_event``); awaited on a Producer."""
        event = score_event(episode_id, name, value, max_event_bytes=self.max_event_bytes, **fields)
        return self.send(event)

    def send(self, event: StepEvent) -> Any:
        raise NotImplementedError

    def _setup(self) -> None:
        """Per-class state, after the options above are set."""
        raise NotImplementedError

    def _recorder(self, fields: EpisodeFields) -> RecT:
        raise NotImplementedError


class Producer(_Producing[EpisodeRecorder]):
    """An idempotent (acks=all) producer of step events for asyncio agents."""

    def _setup(self) -> None:
        self._producer: AIOKafkaProducer | None = None
        self._pending: set[asyncio.Future[Any]] = set()
        self._failure: BaseException | None = None
        self._failed = 0
        #: Between start() and close(); ``_producer`` is None meanwhile only while
        #: ``deliver`` replaces a producer that failed a delivery.
        self._open = False
        self._connecting = asyncio.Lock()
        #: Producers being abandoned (see ``_replace``).
        self._abandoning: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Connect, or raise KafkaUnavailableError within ``timeout_s``."""
        if self._open:
            return
        self._producer = await self._connect()
        self._open = True

    async def _connect(self) -> AIOKafkaProducer:
        producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap_servers,
            acks="all",
            enable_idempotence=True,
            linger_ms=self.linger_ms,
            request_timeout_ms=int(self.timeout_s * 1000),
            max_request_size=self.max_event_bytes + _RECORD_OVERHEAD,
            **self.kafka,
        )
        try:
            async with asyncio.timeout(self.timeout_s):
                await producer.start()
        except (KafkaError, OSError, TimeoutError) as exc:
            await producer.stop()  # nothing was sent, so this returns at once
            raise KafkaUnavailableError(
                f"cannot reach Kafka at {self.bootstrap_servers} within {self.timeout_s:g}s: "
                f"{exc!r}"
            ) from None
        return producer

    async def send(self, event: StepEvent) -> None:
        """Check ``event`` and queue it, keyed by its episode id (see ``send_raw``)."""
        value = encode_event(event, max_bytes=self.max_event_bytes)
        await self.send_raw(event.episode_id.encode(), value)

    async def send_raw(self, key: bytes, value: bytes) -> None:
        """Queue an already checked message; returns once it is buffered, not delivered.

        Waits at most ``timeout_s`` for room (at most ``max_pending`` events wait
        for acknowledgement), then raises KafkaUnavailableError. A delivery that
        failed earlier is raised here as ProduceError.
        """
        producer = self._producer
        if producer is None:
            raise RecorderError("the producer is not started (use start() or async with)")
        self._raise_failure()
        try:
            async with asyncio.timeout(self.timeout_s):
                while len(self._pending) >= self.max_pending:
                    await asyncio.wait(self._pending, return_when=asyncio.FIRST_COMPLETED)
                    self._raise_failure()
                delivery = await producer.send(self.topic, value, key=key)
        except (TimeoutError, KafkaTimeoutError):
            raise self._unavailable(
                f"the send buffer stayed full for {self.timeout_s:g}s "
                f"({len(self._pending)} events waiting)"
            ) from None
        except KafkaError as exc:
            raise ProduceError(f"Kafka refused an event for {self.topic!r}: {exc!r}") from None
        self._pending.add(delivery)
        delivery.add_done_callback(self._delivered)

    async def deliver(self, key: bytes, values: list[bytes], timeout_s: float) -> bool:
        """Send ``values`` in order under ``key`` and wait until Kafka acknowledges every
        one (acks=all), at most ``timeout_s``: whether it did. Unlike ``send_raw``,
        a failure here is this call's alone (never raised by a later send): the
        caller sends the same bytes again, and the worker drops identical copies.

        A delivery that fails, rather than times out, leaves a hole in the idempotent
        producer's sequence numbers for its partition (aiokafka gives up a batch
        whose partition has had no leader for ``timeout_s``, as while the broker
        restarts), and the broker then refuses every later batch of that partition
        with OutOfOrderSequenceNumber: aiokafka never takes a new producer id the way
        Kafka's own client does (aio-libs/aiokafka#1017). So such a failure replaces
        the producer: the next delivery connects a new one (a new producer id), and
        the deliveries still waiting on the old one fail at once."""
        if not self._open:
            raise RecorderError("the producer is not started (use start() or async with)")
        deliveries: list[asyncio.Future[Any]] = []
        producer = None
        try:
            async with asyncio.timeout(timeout_s):
                producer = await self._current()
                for value in values:
                    delivery = await producer.send(self.topic, value, key=key)
                    delivery.add_done_callback(partial(self._delivery_done, producer))
                    deliveries.append(delivery)
                # wait, not gather: a timeout must not cancel aiokafka's futures
                _, waiting = await asyncio.wait(deliveries)
        except (TimeoutError, KafkaTimeoutError, KafkaUnavailableError):
            return False
        except KafkaError:
            self._replace(producer)
            return False
        return not waiting and all(_retrieved(d) is None for d in deliveries)

    async def _current(self) -> AIOKafkaProducer:
        """The producer, connected anew after ``_replace`` (KafkaUnavailableError when
        the broker does not answer)."""
        async with self._connecting:
            producer = self._producer
            if producer is None:
                producer = self._producer = await self._connect()
            return producer

    def _delivery_done(self, producer: AIOKafkaProducer, delivery: asyncio.Future[Any]) -> None:
        """A delivery of ``deliver`` finished, maybe after its call gave up waiting."""
        if _retrieved(delivery) is not None:
            self._replace(producer)

    def _replace(self, producer: AIOKafkaProducer | None) -> None:
        """Abandon ``producer`` after a failed delivery, unless already replaced."""
        if producer is None or producer is not self._producer:
            return
        self._producer = None
        log.warning(
            "a delivery to %r failed: a new Kafka producer (a new producer id) takes over",
            self.topic,
        )
        task = asyncio.create_task(_abandon(producer))
        self._abandoning.add(task)
        task.add_done_callback(self._abandoning.discard)

    async def flush(self, timeout_s: float | None = None) -> None:
        """Wait until every queued event is acknowledged, at most ``timeout_s``."""
        timeout = self.timeout_s if timeout_s is None else timeout_s
        if self._pending:
            _, waiting = await asyncio.wait(self._pending, timeout=timeout)
            if waiting:
                raise self._unavailable(
                    f"{len(waiting)} events were not acknowledged within {timeout:g}s"
                )
        self._raise_failure()

    async def close(self) -> None:
        """Flush, then disconnect; bounded by ``timeout_s`` even when Kafka is gone."""
        producer, self._producer = self._producer, None
        self._open = False
        if self._abandoning:
            await asyncio.wait(self._abandoning, timeout=self.timeout_s)
        if producer is None:
            return
        try:
            await self.flush()
        finally:
            if self._pending:
                self._pending.clear()
                await _abandon(producer)
            else:
                try:
                    async with asyncio.timeout(self.timeout_s):
                        await producer.stop()
                except TimeoutError:
                    await _abandon(producer)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    def _recorder(self, fields: EpisodeFields) -> EpisodeRecorder:
        return EpisodeRecorder(self.send, max_event_bytes=self.max_event_bytes, **fields)

    def _delivered(self, delivery: asyncio.Future[Any]) -> None:
        self._pending.discard(delivery)
        if not delivery.cancelled() and delivery.exception() is not None:
            self._failed += 1
            self._failure = self._failure or delivery.exception()

    def _raise_failure(self) -> None:
        if self._failure is not None:
            failure, failed = self._failure, self._failed
            self._failure, self._failed = None, 0
            raise ProduceError(f"{failed} events to {self.topic!r} were not delivered: {failure!r}")

    def _unavailable(self, what: str) -> KafkaUnavailableError:
        return KafkaUnavailableError(
            f"{what}: Kafka at {self.bootstrap_servers} is not taking events for "
            f"{self.topic!r} (broker down or unreachable, or the topic is missing)"
        )


def _retrieved(delivery: asyncio.Future[Any]) -> BaseException | None:
    """A finished delivery's failure (marking it retrieved, so asyncio does not warn)."""
    return delivery.exception() if not delivery.cancelled() else asyncio.CancelledError()


async def _abandon(producer: AIOKafkaProducer) -> None:
    # AIOKafkaProducer.stop() waits until every buffered batch is delivered, and an
    # idempotent producer retries forever, so with the broker gone it never returns.
    # Cancel its sender and close its connections instead (private, but the only way),
    # then fail the batches it still holds, so nobody waits on them any longer.
    producer._closed = True
    await producer._sender.close()
    await producer.client.close()
    producer._message_accumulator.fail_all(ProducerClosed())
    await asyncio.sleep(0)  # their done callbacks take the failures (no "never retrieved")


class SyncProducer(_Producing[SyncEpisodeRecorder]):
    """The Producer for synchronous agents: runs it on a private event-loop thread.

    Each call returns once the event is buffered; every call is bounded by
    ``timeout_s`` like the async Producer's.
    """

    def _setup(self) -> None:
        self._async = Producer(
            self.bootstrap_servers,
            topic=self.topic,
            timeout_s=self.timeout_s,
            max_pending=self.max_pending,
            linger_ms=self.linger_ms,
            max_event_bytes=self.max_event_bytes,
            **self.kafka,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._loop is not None:
            return
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="stream-export-producer", daemon=True
        )
        self._thread.start()
        try:
            self._call(self._async.start())
        except BaseException:
            self._stop_loop()
            raise

    def send(self, event: StepEvent) -> None:
        self._call(self._async.send(event))

    def send_raw(self, key: bytes, value: bytes) -> None:
        self._call(self._async.send_raw(key, value))

    def flush(self, timeout_s: float | None = None) -> None:
        self._call(self._async.flush(timeout_s))

    def close(self) -> None:
        if self._loop is None:
            return
        try:
            self._call(self._async.close())
        finally:
            self._stop_loop()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _recorder(self, fields: EpisodeFields) -> SyncEpisodeRecorder:
        return SyncEpisodeRecorder(self.send, max_event_bytes=self.max_event_bytes, **fields)

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            coro.close()
            raise RecorderError("the producer is not started (use start() or with)")
        future = asyncio.run_coroutine_threadsafe(coro, self._loop)
        # The coroutines bound their own waits; this backstop only guards the thread.
        try:
            return future.result(timeout=3 * self.timeout_s + 5)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise KafkaUnavailableError(
                f"the producer thread did not answer within {3 * self.timeout_s + 5:g}s"
            ) from None

    def _stop_loop(self) -> None:
        loop, thread = self._loop, self._thread
        self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5)
        loop.close()


# --- `stream-export produce`: JSON lines in, checked events out -------------------


@dataclass
class ProduceReport:
    """What ``produce_lines`` did: events sent, bad lines (number, error), where it stopped."""

    sent: int = 0
    bad: list[tuple[int, DecodeError]] = field(default_factory=list)
    #: The line that stopped the run (on_error="stop"); nothing after it was sent.
    stopped_at: int | None = None


async def read_lines(stream: BinaryIO, *, interactive: bool = False) -> AsyncIterator[bytes]:
    """The lines of ``stream``, read off the event loop so sending goes on meanwhile.

    ``interactive`` hands over each line as soon as it arrives (a pipe from a live
    agent) instead of reading ahead in 64 KiB chunks.
    """

    def read() -> list[bytes]:
        if interactive:
            line = stream.readline()
            return [line] if line else []
        return stream.readlines(1 << 16)

    while lines := await asyncio.to_thread(read):
        for line in lines:
            yield line


async def produce_lines(
    producer: Producer | None,
    lines: AsyncIterable[bytes],
    *,
    on_error: Literal["stop", "skip"] = "stop",
    max_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    on_bad_line: Callable[[int, DecodeError], None] = lambda number, error: None,
) -> ProduceReport:
    """Send each valid JSON line unchanged, keyed by its episode id; ``producer=None``
    only checks. Lines are numbered from 1; blank lines are skipped.

    A bad line is reported through ``on_bad_line``; then "skip" goes on with the next
    line and "stop" sends nothing more. Flushes before returning.
    """
    report = ProduceReport()
    number = 0
    async for line in lines:
        number += 1
        data = line.strip()
        if not data:
            continue
        try:
            event = decode_event(data, max_bytes=max_bytes)
        except DecodeError as exc:
            report.bad.append((number, exc))
            on_bad_line(number, exc)
            if on_error == "stop":
                report.stopped_at = number
                break
            continue
        if producer is not None:
            await producer.send_raw(event.episode_id.encode(), data)
        report.sent += 1
    if producer is not None:
        await producer.flush()
    return report
