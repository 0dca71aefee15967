"""What every request passes before (and around) its handler: the Host and the
content type (:mod:`stream_export.gateway.access`), the body's size, the bytes of
all bodies held at once, the body's read time and nesting; and the one place a
refusal (:class:`GatewayRefusal`) becomes an OpenAI-shaped error and is counted.

Memory: a body is held, decoded and re-encoded for the upstream until its call is
answered, a few times its size in all, so the bodies in flight are bounded as a
whole (``gateway.max_inflight_request_bytes``), each by its Content-Length (else
``max_request_bytes``) from before it is read until the request is answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from prometheus_client import Gauge

from stream_export.contract.decoding import MAX_DEPTH, deeper_than
from stream_export.errors import GatewayRefusal, JsonTooDeepError
from stream_export.gateway import wire
from stream_export.gateway.access import Access
from stream_export.gateway.call import error
from stream_export.gateway.mapping import Json
from stream_export.gateway.metrics import GatewayMetrics
from stream_export.settings.gateway import GatewaySettings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
#: Read-only operations endpoints, answered whatever the Host: Prometheus and
#: probes address the gateway by a service name or a pod's address.
OPEN_PATHS: Final = frozenset({"/metrics", "/healthz"})


class InFlight:
    """The request-body bytes held at once, bounded; ``shown`` on a gauge."""

    def __init__(self, limit: int, shown: Gauge) -> None:
        self.limit = limit
        self.bytes = 0
        self.shown = shown

    def take(self, size: int) -> bool:
        """Hold ``size`` more bytes, unless that passes the limit while others are
        held (a request alone always goes, whatever its size)."""
        if self.bytes and self.bytes + size > self.limit:
            return False
        self.bytes += size
        self.shown.set(self.bytes)
        return True

    def give(self, size: int) -> None:
        self.bytes -= size
        self.shown.set(self.bytes)


class Edge:
    def __init__(
        self,
        settings: GatewaySettings,
        access: Access,
        max_request_bytes: int,
        metrics: GatewayMetrics,
    ) -> None:
        self.access = access
        self.max_request_bytes = max_request_bytes
        self.body_timeout_s = settings.body_timeout_s
        self.retry_after_s = settings.retry_after_s
        self.inflight = InFlight(
            settings.max_inflight_request_bytes, metrics.request_bytes_in_flight
        )
        self.metrics = metrics

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            unserved(request)
            size = self.admit(request)
            try:
                return await handler(request)
            finally:
                self.inflight.give(size)
        except GatewayRefusal as refused:
            return self.refused(refused)

    def admit(self, request: web.Request) -> int:
        """The body bytes the request holds while it is served (0 for a GET);
        GatewayRefusal when it is not answered."""
        if request.path in OPEN_PATHS:
            return 0
        if not self.access.host_allowed(request.host):
            raise GatewayRefusal(
                421,
                "the gateway does not answer to this Host: use its address, localhost or "
                "gateway.public_url, or add the name to gateway.allowed_hosts",
                reason="host_not_allowed",
            )
        if request.method != "POST":
            return 0
        if request.content_type != "application/json":
            raise GatewayRefusal(
                415, "send the body as Content-Type: application/json", reason="not_json_type"
            )
        length = request.content_length
        if length is not None and length > self.max_request_bytes:
            raise _too_large(self.max_request_bytes)
        size = self.max_request_bytes if length is None else length
        if not self.inflight.take(size):
            raise GatewayRefusal(
                503,
                "too many request bytes are being served (gateway.max_inflight_request_bytes);"
                " retry later",
                reason="requests_in_flight",
            )
        return size

    def refused(self, refused: GatewayRefusal) -> web.Response:
        self.metrics.refused_requests.labels(refused.reason).inc()
        headers = {"Retry-After": str(self.retry_after_s)} if refused.status == 503 else {}
        response = error(refused.status, refused.detail, refused.reason, **headers)
        if refused.status == 408:  # the rest of a slow body is not waited for
            response.force_close()
        return response

    async def body(self, request: web.Request) -> Json:
        """The request's JSON object, read within gateway.body_timeout_s."""
        try:
            async with asyncio.timeout(self.body_timeout_s):
                data = await request.read()
        except TimeoutError:
            raise GatewayRefusal(
                408,
                f"the body did not arrive within {self.body_timeout_s:g} s "
                "(gateway.body_timeout_s)",
                reason="body_timeout",
            ) from None
        except web.HTTPRequestEntityTooLarge:
            raise _too_large(self.max_request_bytes) from None
        try:
            body = wire.decode(data)
        except JsonTooDeepError:
            raise _too_deep() from None
        except ValueError:
            raise GatewayRefusal(400, "the body is not JSON", reason="invalid_json") from None
        if not isinstance(body, dict):
            raise GatewayRefusal(400, "the body is not a JSON object", reason="invalid_json")
        if deeper_than(body, MAX_DEPTH):
            raise _too_deep()
        return body


#: What the gateway records, named by an unserved route's error.
SERVED: Final = "POST /v1/chat/completions and POST /v1/completions"


def unserved(request: web.Request) -> None:
    """GatewayRefusal ``unsupported_route`` (404, or 405 for a served path asked with
    another method) in OpenAI's shape, naming what the gateway serves and the fix
    for the AI SDK, whose default ``openai(model)`` speaks the Responses API."""
    failed = request.match_info.http_exception
    if failed is None or failed.status not in (404, 405):
        return
    raise GatewayRefusal(
        failed.status,
        f"the stream-export gateway does not serve {request.method} {request.path}: it "
        f"records {SERVED} (with the AI SDK: createOpenAI({{ baseURL }}).chat(model), "
        "not openai(model), which speaks the Responses API)",
        reason="unsupported_route",
    )


def _too_deep() -> GatewayRefusal:
    return GatewayRefusal(
        400,
        f"the body nests objects and arrays deeper than {MAX_DEPTH} levels",
        reason="too_deep",
    )


def _too_large(limit: int) -> GatewayRefusal:
    return GatewayRefusal(
        413,
        f"the request is larger than {limit} bytes (gateway.max_request_bytes)",
        reason="request_too_large",
    )


def own_url(request: web.Request) -> str:
    """The address the client's connection reached (never its Host header)."""
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    host, port = sockname[:2] if sockname else ("127.0.0.1", 0)
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def raise_open_files_limit() -> int:
    """Raise the soft limit of open files to the hard one (as Go's runtime does at
    start), so a connection flood meets the system's bound, not a default of
    1,024; the limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        soft = hard
    return soft
