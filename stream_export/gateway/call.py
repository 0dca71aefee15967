"""One model call through the gateway: the upstream's answer (whole or streamed),
recorded, then answered, and observed in the metrics."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from aiohttp import web

from stream_export.contract.calls import CallRequest, WeightVersion
from stream_export.errors import UpstreamError
from stream_export.gateway import refused, wire
from stream_export.gateway.book import OpenEpisode
from stream_export.gateway.mapping import (
    Asked,
    Endpoint,
    Json,
    Sampled,
    StreamGather,
    sampled,
    strip,
)
from stream_export.gateway.upstream import Failure
from stream_export.telemetry import logs

if TYPE_CHECKING:
    from stream_export.gateway.server import Gateway

log = logging.getLogger(__name__)

_SSE: Final = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
_DONE: Final = b"data: [DONE]"
#: The error answered instead of a call, by its outcome.
REFUSALS: Final = {
    "refused": (
        503,
        "Kafka did not acknowledge the call's record in time; retry later",
        "kafka_unavailable",
    ),
    "rejected": (
        413,
        "the call is larger than assemble.max_event_bytes: it cannot be recorded",
        "call_too_large",
    ),
}


#: What a call stopped by a weight fence (weights.in_flight = "abort") is told.
STOPPED: Final = "the model's weights are being updated: this call was stopped; retry later"


def error(status: int, message: str, code: str, **headers: str) -> web.Response:
    """An error in OpenAI's shape, which the SDKs show."""
    body = {"error": {"message": message, "type": code, "code": code}}
    return wire.response(body, status=status, headers=headers)


def upstream_failed(exc: UpstreamError) -> web.Response:
    """A 504 for an upstream that did not answer in time, else a 502."""
    return error(504 if exc.reason == "upstream_timeout" else 502, exc.detail, exc.reason)


class Call:
    """One model call through the gateway: upstream, record, answer, observe."""

    def __init__(
        self,
        gateway: Gateway,
        request: web.Request,
        endpoint: Endpoint,
        episode: OpenEpisode,
        wanted: CallRequest,
        started: float,
        plain: Json | None = None,
        stamp: WeightVersion | None = None,
    ) -> None:
        self.gateway, self.request, self.endpoint = gateway, request, endpoint
        self.episode, self.wanted, self.started = episode, wanted, started
        #: The upstream body without the fields the gateway adds (None: none added).
        self.plain = plain
        #: Why this call's tokens are not recorded although asked for, if known now.
        self.lost: str | None = None
        #: The weight version the fence admitted the call under (None: no fence).
        self.stamp = stamp
        self.upstream_s = 0.0
        #: Sent upstream as X-Request-Id on every attempt (vLLM names its answer
        #: after it) and back to the client; recorded when the answer has no id.
        self.request_id = secrets.token_hex(16)
        #: Whether a weight fence stopped it (weights.in_flight = "abort").
        self.stopped = False
        #: The task running its upstream part, while it runs.
        self._upstream: asyncio.Task[object] | None = None

    def stop(self) -> None:
        """End the call's upstream part now (a weight fence began): cancelled, it is
        answered as stopped (``_was_stopped``). Recording is never interrupted."""
        self.stopped = True
        if self._upstream is not None:
            self._upstream.cancel()

    @contextlib.contextmanager
    def _stoppable(self) -> Iterator[None]:
        """The upstream part, which ``stop`` cancels (at once if stopped before)."""
        if self.stopped:
            raise asyncio.CancelledError
        self._upstream = asyncio.current_task()
        try:
            yield
        finally:
            self._upstream = None

    def _was_stopped(self) -> bool:
        """Whether a CancelledError being handled came from ``stop`` (then taken
        back, so the call can be answered and recorded) rather than from outside."""
        if not self.stopped:
            return False
        task = asyncio.current_task()
        if task is not None:
            task.uncancel()
        return True

    def done(self, outcome: str) -> None:
        metrics = self.gateway.metrics
        metrics.calls.labels(self.endpoint, outcome).inc()
        metrics.upstream_seconds.observe(self.upstream_s)
        metrics.added_seconds.observe(max(0.0, time.monotonic() - self.started - self.upstream_s))

    def failed(self, exc: UpstreamError) -> web.Response:
        self.done("upstream_error")
        return upstream_failed(exc)

    def passed_on(self, failure: Failure) -> web.Response:
        self.done("upstream_error")
        return web.Response(
            status=failure.status,
            body=failure.body,
            headers={"Content-Type": failure.content_type, **self.headers()},
        )

    def headers(self) -> dict[str, str]:
        return {"X-Request-Id": self.request_id}

    def without_refused(self, failure: Failure, sent: Json) -> Json | None:
        """The body to ask again with when the upstream refused a field the gateway
        added (``stream_export.gateway.refused``), else None."""
        if self.plain is None:
            return None
        field = refused.refused_field(failure, refused.added(sent, self.plain))
        if field is None:
            return None
        self.gateway.upstreams.refused_fields(self.episode.episode_id, field)
        plain, self.plain, self.lost = self.plain, None, "fields_refused"
        return plain

    async def recorded(self, call: Sampled) -> str:
        call.request_id = call.request_id or self.request_id
        call.lost = call.lost or self.lost
        if call.lost is not None:
            self.gateway.metrics.token_capture_lost.labels(call.lost).inc()
            logs.event(
                log,
                "gateway.tokens_lost",
                logging.WARNING,
                reason=call.lost,
                effect="the call is answered and recorded without token ids",
            )
        return await self.gateway.record(self.episode, self.wanted, call, self.stamp)

    async def whole(self, path: str, sent: Json, asked: Asked) -> web.Response:
        began = time.monotonic()
        try:
            with self._stoppable():
                answer = await self.gateway.upstreams.post(
                    path, sent, self.episode.episode_id, self.request_id
                )
            self.upstream_s = time.monotonic() - began
            if isinstance(answer, Failure):
                if (again := self.without_refused(answer, sent)) is not None:
                    return await self.whole(path, again, asked)
                return self.passed_on(answer)
            call = sampled(self.endpoint, answer, tokens=self.gateway.settings.capture_tokens)
        except UpstreamError as exc:
            self.upstream_s = time.monotonic() - began
            return self.failed(exc)
        except asyncio.CancelledError:
            if not self._was_stopped():
                raise
            self.upstream_s = time.monotonic() - began
            return self._stopped_early()
        outcome = await self.recorded(call)
        self.done(outcome)
        return self.gateway.refusal(outcome) or wire.response(
            strip(answer, asked), headers=self.headers()
        )

    async def stream(self, path: str, sent: Json, asked: Asked) -> web.StreamResponse:
        response = web.StreamResponse(headers={**_SSE, **self.headers()})
        gather = StreamGather(self.endpoint, tokens=self.gateway.settings.capture_tokens)
        aborted = False
        began = time.monotonic()
        chunks = self.gateway.upstreams.stream(path, sent, self.episode.episode_id, self.request_id)
        try:
            with self._stoppable():
                async with contextlib.aclosing(chunks):
                    async for chunk in chunks:
                        if isinstance(chunk, Failure):
                            self.upstream_s = time.monotonic() - began
                            if (again := self.without_refused(chunk, sent)) is not None:
                                return await self.stream(path, again, asked)
                            return self.passed_on(chunk)
                        if chunk is None:
                            break
                        if "error" in chunk:
                            said = chunk["error"]
                            raise UpstreamError(f"the upstream failed mid-stream: {said}")
                        gather.feed(chunk)
                        if not response.prepared:
                            await response.prepare(self.request)
                        data = b"data: " + wire.encode(strip(chunk, asked))
                        if not await _write(response, data):
                            aborted = True
                            break
            self.upstream_s = time.monotonic() - began
            call = gather.result(aborted=aborted)
        except UpstreamError as exc:
            self.upstream_s = time.monotonic() - began
            if not response.prepared:
                return self.failed(exc)
            # The upstream failed mid-stream (it died, it sent an error): what it
            # streamed was sampled and reached the client, so, as when the client
            # leaves, it is recorded as an aborted call; the client gets the error.
            await self.recorded(gather.result(aborted=True))
            self.done("aborted")
            await _write(response, b"data: " + wire.encode(_error_body(exc.detail, exc.reason)))
            return response
        except asyncio.CancelledError:
            if not self._was_stopped():
                raise
            self.upstream_s = time.monotonic() - began
            if not response.prepared:
                return self._stopped_early()
            # Stopped by a weight fence: what was streamed is recorded as an aborted
            # call under the version that sampled it; the client gets the error.
            await self.recorded(gather.result(aborted=True))
            self.done("aborted")
            await _write(response, b"data: " + wire.encode(_error_body(STOPPED, "fenced")))
            return response
        outcome = await self.recorded(call)
        self.done("aborted" if aborted else outcome)
        if aborted:
            return response
        if not response.prepared:
            await response.prepare(self.request)
        if outcome in REFUSALS:
            _, message, code = REFUSALS[outcome]
            await _write(response, b"data: " + wire.encode(_error_body(message, code)))
        elif await _write(response, _DONE):
            await response.write_eof()
        return response

    def _stopped_early(self) -> web.Response:
        """Stopped by a weight fence before anything was answered: nothing sampled
        reached the client, so nothing is recorded; it retries after the fence."""
        self.done("fenced")
        return error(
            503, STOPPED, "fenced", **{"Retry-After": str(self.gateway.settings.retry_after_s)}
        )


def _error_body(message: str, code: str) -> Json:
    return {"error": {"message": message, "type": code, "code": code}}


async def _write(response: web.StreamResponse, data: bytes) -> bool:
    """Write one server-sent event; False when the client has gone."""
    try:
        await response.write(data + b"\n\n")
    except ConnectionError:
        return False
    return True
