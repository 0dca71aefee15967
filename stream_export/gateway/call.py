"""One model call through the gateway: the upstream's answer (whole or streamed),
recorded, then answered, and observed in the metrics."""

from __future__ import annotations

import contextlib
import secrets
import time
from typing import TYPE_CHECKING, Final

from aiohttp import web

from stream_export.contract.calls import CallRequest, WeightVersion
from stream_export.errors import UpstreamError
from stream_export.gateway import wire
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

if TYPE_CHECKING:
    from stream_export.gateway.server import Gateway

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
        stamp: WeightVersion | None = None,
    ) -> None:
        self.gateway, self.request, self.endpoint = gateway, request, endpoint
        self.episode, self.wanted, self.started = episode, wanted, started
        #: The weight version the fence admitted the call under (None: no fence).
        self.stamp = stamp
        self.upstream_s = 0.0
        #: Sent upstream as X-Request-Id on every attempt (vLLM names its answer
        #: after it) and back to the client; recorded when the answer has no id.
        self.request_id = secrets.token_hex(16)

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

    async def recorded(self, call: Sampled) -> str:
        call.request_id = call.request_id or self.request_id
        return await self.gateway.record(self.episode, self.wanted, call, self.stamp)

    async def whole(self, path: str, sent: Json, asked: Asked) -> web.Response:
        began = time.monotonic()
        try:
            answer = await self.gateway.upstreams.post(
                path, sent, self.episode.episode_id, self.request_id
            )
            self.upstream_s = time.monotonic() - began
            if isinstance(answer, Failure):
                return self.passed_on(answer)
            call = sampled(self.endpoint, answer, tokens=self.gateway.settings.capture_tokens)
        except UpstreamError as exc:
            self.upstream_s = time.monotonic() - began
            return self.failed(exc)
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
            async with contextlib.aclosing(chunks):
                async for chunk in chunks:
                    if isinstance(chunk, Failure):
                        self.upstream_s = time.monotonic() - began
                        return self.passed_on(chunk)
                    if chunk is None:
                        break
                    if "error" in chunk:
                        raise UpstreamError(f"the upstream failed mid-stream: {chunk['error']}")
                    gather.feed(chunk)
                    if not response.prepared:
                        await response.prepare(self.request)
                    if not await _write(response, b"data: " + wire.encode(strip(chunk, asked))):
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


def _error_body(message: str, code: str) -> Json:
    return {"error": {"message": message, "type": code, "code": code}}


async def _write(response: web.StreamResponse, data: bytes) -> bool:
    """Write one server-sent event; False when the client has gone."""
    try:
        await response.write(data + b"\n\n")
    except ConnectionError:
        return False
    return True
