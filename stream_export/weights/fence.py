"""The trainer's side of the weight fence.

::

    async with WeightFence(settings) as fence:
        async with fence.update(7):        # begin(7): every replica holds, none in flight
            vllm.load(url, checkpoint, 7)  # new weights, while no call runs
        # commit(7): calls flow again, each recorded with weight_version 7

``begin`` publishes a begin record on the control topic and returns once every
live gateway replica acknowledged it (a replica acknowledges when it holds new
calls and has none in flight); a replica whose lease runs out is not waited for.
``commit`` publishes the commit: the replicas let calls flow, stamped with the
version. One trainer drives the fence; ``commit`` of a version not newer than
the one serving is refused (FenceError version_not_newer), and so is a commit
after the fence expired (fence_expired: begin again).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Self

from stream_export.contract.calls import WeightVersion
from stream_export.contract.weights import Abort, Begin, Commit
from stream_export.errors import FenceError, ServerRestartedError, WeightLoadError
from stream_export.settings import Settings
from stream_export.weights.state import newer
from stream_export.weights.topic import ControlTopic

#: The longest reason an abort record may carry (the bound of Abort.reason in
#: the contract: a longer one is a record no replica can read).
REASON_CHARS = 1024
#: How long one write or catch-up of the control topic may take.
KAFKA_TIMEOUT_S = 30.0


class WeightFence:
    """A trainer's fence client (an async context manager: ``start``/``close``)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings.weights
        self.topic = ControlTopic(settings, "trainer")

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        await self.topic.start()

    async def close(self) -> None:
        await self.topic.close()

    async def serving(self) -> WeightVersion | None:
        """The version serving calls now (None: none was ever committed)."""
        await self.topic.catch_up(KAFKA_TIMEOUT_S)
        return self.topic.state.serving

    async def begin(self, version: WeightVersion, timeout_s: float | None = None) -> str:
        """Fence the gateways for ``version``; returns (its fence id) once no call is
        in flight on any live replica. ``timeout_s``: how long until the fence expires
        uncommitted (default weights.fence_timeout_s). A fence still open (a trainer
        that died) is replaced. FenceError when ``version`` is not newer than the one
        serving, or when the replicas did not acknowledge within
        weights.ack_timeout_s (the fence is then aborted)."""
        state = self.topic.state
        await self.topic.catch_up(KAFKA_TIMEOUT_S)
        if not newer(version, state.serving):
            raise FenceError(
                f"version {version!r} is not newer than {state.serving!r}, which serves",
                reason="version_not_newer",
            )
        begin = Begin(
            fence_id=uuid.uuid4().hex,
            version=version,
            serving=state.serving,
            at=time.time(),
            timeout_s=timeout_s or self.settings.fence_timeout_s,
        )
        await self.topic.send(begin, KAFKA_TIMEOUT_S)
        deadline = time.monotonic() + self.settings.ack_timeout_s
        while waiting := state.unacknowledged(begin.fence_id, time.time()):
            if time.monotonic() > deadline:
                await self.abort(f"not acknowledged by {sorted(waiting)}")
                raise FenceError(
                    f"replicas {sorted(waiting)} did not acknowledge the fence within "
                    f"{self.settings.ack_timeout_s:g} s (weights.ack_timeout_s); aborted",
                    reason="fence_not_acknowledged",
                )
            await self.topic.read(0.1)
        return begin.fence_id

    async def commit(self, version: WeightVersion) -> None:
        """``version`` is loaded: lift the fence (returns once the broker has it)."""
        state = self.topic.state
        await self.topic.catch_up(KAFKA_TIMEOUT_S)
        fence = state.open_fence
        if not newer(version, state.serving):
            raise FenceError(
                f"cannot commit version {version!r}: {state.serving!r} serves, which is not older",
                reason="version_not_newer",
            )
        if fence is None or fence.version != version:
            raise FenceError(f"no open fence for version {version!r}", reason="no_open_fence")
        if state.expired(time.time()):
            raise FenceError(
                f"the fence for version {version!r} expired ({fence.timeout_s:g} s after "
                "its begin): begin again",
                reason="fence_expired",
            )
        commit = Commit(fence_id=fence.fence_id, version=version, at=time.time())
        await self.topic.send(commit, KAFKA_TIMEOUT_S)

    async def abort(self, reason: str = "") -> None:
        """Give the open fence up: calls flow again under the version that served."""
        state = self.topic.state
        await self.topic.catch_up(KAFKA_TIMEOUT_S)
        fence = state.open_fence
        if fence is None:
            return
        said = reason[:REASON_CHARS]
        abort = Abort(fence_id=fence.fence_id, serving=fence.serving, at=time.time(), reason=said)
        await self.topic.send(abort, KAFKA_TIMEOUT_S)

    @asynccontextmanager
    async def update(
        self, version: WeightVersion, timeout_s: float | None = None
    ) -> AsyncIterator[str]:
        """``begin`` on entry, ``commit`` on a clean exit. When the body raises, the
        fence is aborted only if the weights that served before serve again: the
        server was not touched (WeightLoadError checkpoint_mismatch), or it was
        restarted on them (ServerRestartedError of the version the fence began
        from). Else it stays closed until it expires (weights.on_fence_timeout)
        or the trainer aborts it once the old weights serve again: nothing is
        recorded under weights nobody knows."""
        fence_id = await self.begin(version, timeout_s)
        before = self.topic.state.serving
        try:
            yield fence_id
        except ServerRestartedError as exc:
            if exc.serving == before:
                reason = f"reload failed; the server was restarted on version {before!r}"
                await asyncio.shield(self.abort(reason))
            raise
        except WeightLoadError as exc:
            if exc.reason == "checkpoint_mismatch":
                await asyncio.shield(self.abort(f"checkpoint refused: {exc.detail}"))
            raise
        await self.commit(version)
