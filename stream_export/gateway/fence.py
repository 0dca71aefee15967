"""A gateway replica's side of the weight fence (weights.enabled): it follows the
control topic, holds new calls while a fence is open, acknowledges a fence once
its calls in flight finished, and stamps each call with the version that was
committed when it was let through.

Calls in flight when a fence begins finish under the version that admitted them
(or, with weights.in_flight = "abort", are stopped: each call's ``stop``): the
replica acknowledges only when none is left, and the trainer loads new weights
only after every live replica acknowledged, so a call's stamp is the version
that served all of it. A new call waits while fenced, at most
weights.max_hold_s (then 503 ``fenced`` with Retry-After). The replica renews a
lease on the topic every quarter of weights.lease_s; one that could not renew for
half of it (cut off from Kafka: it would miss a fence) holds new calls too,
before the trainer stops waiting for it (its lease runs out at weights.lease_s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable, Iterator
from typing import Final

from aiohttp import web
from aiokafka.errors import KafkaError

from stream_export.contract.calls import WeightVersion, version_key
from stream_export.contract.weights import Abort, Ack, Begin, Commit, ControlRecord, Lease
from stream_export.errors import FenceError
from stream_export.gateway.call import error
from stream_export.gateway.metrics import GatewayMetrics
from stream_export.settings import Settings
from stream_export.telemetry import logs
from stream_export.weights.topic import ControlTopic

log = logging.getLogger(__name__)
#: How long one wait on the control topic lasts (how soon a begin is seen).
POLL_S: Final = 0.05


class GatewayFence:
    """A replica following the control topic; ``admit`` and ``calling`` around each call."""

    def __init__(self, settings: Settings, metrics: GatewayMetrics) -> None:
        w = self.settings = settings.weights
        self.retry_after_s = settings.gateway.retry_after_s
        self.replica = w.replica or f"{socket.gethostname()}:{settings.gateway.port}"
        self.metrics = metrics
        self.topic = ControlTopic(settings, "gateway")
        self.state = self.topic.state
        self.inflight = 0
        #: How to stop each call in flight (weights.in_flight = "abort").
        self._stops: set[Callable[[], None]] = set()
        #: Set while calls may flow (no open fence, the lease renewed), as of the
        #: last ``_update`` (every POLL_S).
        self.flowing = asyncio.Event()
        self.drained = asyncio.Event()
        self.drained.set()
        #: When this replica's newest lease read back from the topic was written.
        self.renewed_at = 0.0
        self._acked: str | None = None
        #: When each fence seen begin (for fence_seconds).
        self._begun: dict[str, float] = {}
        self._tasks: list[asyncio.Task[None]] = []
        #: The acknowledgement of the open fence, waiting for the calls in flight.
        self._acking: asyncio.Task[None] | None = None

    @property
    def version(self) -> WeightVersion | None:
        return self.state.serving

    async def start(self) -> None:
        """Read the topic up to this replica's new lease (a fence already open then
        holds calls at once), then renew the lease and follow the topic."""
        await self.topic.start()
        await self._renew()
        deadline = time.monotonic() + self.settings.lease_s * 3
        while not self.renewed_at and time.monotonic() < deadline:
            self._observe(await self.topic.read(POLL_S))
        if not self.renewed_at:
            raise FenceError("cannot read the control topic back", reason="control_unavailable")
        self._update()
        self._tasks += [
            asyncio.create_task(self._follow_forever()),
            asyncio.create_task(self._lease_forever()),
        ]
        logs.event(log, "gateway.fence_following", replica=self.replica, version=self.version)

    async def close(self) -> None:
        for task in [*self._tasks, *([self._acking] if self._acking else [])]:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        with contextlib.suppress(FenceError):  # gone cleanly: no fence waits for this lease
            await self.topic.publish(None, f"lease/{self.replica}".encode(), 5.0)
        await self.topic.close()

    # --- calls -----------------------------------------------------------------

    async def admit(self) -> tuple[WeightVersion | None, web.Response | None]:
        """The version a new call is stamped with, or the 503 that refuses it (held
        past weights.max_hold_s, or a fence that expired under on_fence_timeout=refuse).
        The caller counts the call in flight (``calling``) before its next await."""
        if self._flows():
            return self.version, None
        self.metrics.fence_calls.labels("held").inc()
        deadline = time.monotonic() + self.settings.max_hold_s
        while not self._flows():
            left = deadline - time.monotonic()
            if left <= 0 or self._expired_refusing():
                self.metrics.fence_calls.labels("refused").inc()
                return None, self._refusal()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(min(left, self.settings.lease_s / 6)):
                    await self.flowing.wait()
        self.metrics.fence_calls.labels("released").inc()
        return self.version, None

    @contextlib.contextmanager
    def calling(self, stop: Callable[[], None]) -> Iterator[None]:
        """Count a call in flight; ``stop`` ends it early when a fence begins and
        weights.in_flight is "abort"."""
        self.inflight += 1
        self._stops.add(stop)
        self.drained.clear()
        try:
            yield
        finally:
            self._stops.discard(stop)
            self.inflight -= 1
            if not self.inflight:
                self.drained.set()

    def _flows(self) -> bool:
        return self.flowing.is_set()

    def _expired_refusing(self) -> bool:
        return self.settings.on_fence_timeout == "refuse" and self.state.expired(time.time())

    def _refusal(self) -> web.Response:
        if self._expired_refusing():
            message = (
                "a weight update was begun and never committed (its trainer stopped); "
                "calls wait for a trainer to commit or abort a fence"
            )
        else:
            message = "the model's weights are being updated; retry later"
        return error(503, message, "fenced", **{"Retry-After": str(self.retry_after_s)})

    # --- the topic -------------------------------------------------------------

    def _update(self) -> None:
        """Open or close the gate after what was read, and acknowledge a new fence
        once the calls in flight finished."""
        fence = self.state.open_fence
        now = time.time()
        expired = self.state.expired(now)
        closed = fence is not None and not (expired and self.settings.on_fence_timeout == "resume")
        leased = now - self.renewed_at < self.settings.lease_s / 2
        if closed or not leased:
            self.flowing.clear()
        else:
            self.flowing.set()
        self.metrics.fenced.set(0 if self._flows() else 1)
        kind, value, _ = version_key(self.version) if self.version is not None else (1, 0, "")
        self.metrics.weight_version.set(value if kind == 0 else -1)
        if fence is not None and not expired and self._acked != fence.fence_id:
            self._acked = fence.fence_id
            if self._acking is not None:
                self._acking.cancel()  # a newer fence replaced the one it waits for
            if self.settings.in_flight == "abort":
                for stop in list(self._stops):
                    stop()
            self._acking = asyncio.create_task(self._acknowledge(fence))

    async def _acknowledge(self, fence: Begin) -> None:
        await self.drained.wait()
        ack = Ack(replica=self.replica, fence_id=fence.fence_id, at=time.time())
        for _ in range(3):
            try:
                await self.topic.send(ack, self.settings.lease_s)
            except FenceError as exc:
                logs.event(log, "gateway.fence_ack_failed", logging.WARNING, error=exc.detail)
                continue
            logs.event(log, "gateway.fence_acknowledged", version=fence.version)
            return

    async def _follow_forever(self) -> None:
        while True:
            try:
                records = await self.topic.read(POLL_S)
            except KafkaError as exc:  # a broker away: keep following
                logs.event(log, "gateway.fence_read_failed", logging.WARNING, error=repr(exc))
                await asyncio.sleep(POLL_S)
                continue
            self._observe(records)
            self._update()

    def _observe(self, records: list[ControlRecord]) -> None:
        for record in records:
            if isinstance(record, Lease) and record.replica == self.replica:
                self.renewed_at = max(self.renewed_at, record.at)
            elif isinstance(record, Begin):
                self._begun[record.fence_id] = record.at
                logs.event(log, "gateway.fence_begun", version=record.version)
            elif isinstance(record, Commit | Abort):
                began = self._begun.pop(record.fence_id, None)
                if began is not None:
                    self.metrics.fence_seconds.observe(max(0.0, record.at - began))
                outcome = "committed" if isinstance(record, Commit) else "aborted"
                logs.event(log, f"gateway.fence_{outcome}", version=self.state.serving)

    async def _renew(self) -> None:
        """Write a new lease. It counts (calls flow) from when this replica reads it
        back: in the topic's one order, every record written before it was read
        first, so a replica back from a partition never lets a call through under
        a version that a fence replaced meanwhile."""
        lease = Lease(replica=self.replica, at=time.time(), lease_s=self.settings.lease_s)
        await self.topic.send(lease, self.settings.lease_s / 4)

    async def _lease_forever(self) -> None:
        while True:
            await asyncio.sleep(self.settings.lease_s / 4)
            try:
                await self._renew()
            except FenceError as exc:
                logs.event(log, "gateway.lease_not_renewed", logging.WARNING, error=exc.detail)
            self._update()
