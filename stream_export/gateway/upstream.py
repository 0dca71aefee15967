"""The gateway's side of the inference servers: one aiohttp session, bounded answers.

An episode's calls all go to the same upstream (chosen by a hash of its id), so
the server's prefix cache sees the whole conversation. A call is retried only
before its answer started (the upstream could not be reached, or answered 502,
503 or 504), at most ``gateway.upstream_retries`` times, each on the next
upstream of the list after a bounded backoff, and always with the same request
id (``X-Request-Id``, which vLLM takes as its own). Nothing is recorded before
an answer arrived, so a retry never records a call twice; once an answer (or a
stream's first chunk) arrived, nothing is retried.

What the client is told of a failure names no upstream (its host and port are
the operator's, logged as a warning).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import zlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Final

import aiohttp

from stream_export.errors import UpstreamError
from stream_export.gateway import wire
from stream_export.settings.gateway import GatewaySettings
from stream_export.telemetry import logs

log = logging.getLogger(__name__)
Json = dict[str, Any]
#: An upstream's answers that mean "not now" (a proxy or server restarting): retried.
RETRIED_STATUSES: Final = frozenset({502, 503, 504})
#: Failures before any answer arrived: the connection could not be made (refused,
#: no route, connect timeout) or was dropped before the answer's status. A read
#: timeout is not retried: the upstream is slow, not gone (a 504 to the client).
RETRIED_ERRORS: Final = (
    aiohttp.ClientConnectorError,
    aiohttp.ConnectionTimeoutError,
    aiohttp.ServerDisconnectedError,
)
#: The first retry waits this long, each next one twice as long, at most BACKOFF_MAX_S.
BACKOFF_S: Final = 0.1
BACKOFF_MAX_S: Final = 2.0


@dataclass
class Failure:
    """An upstream's error answer, passed on to the client as it is."""

    status: int
    body: bytes
    content_type: str


def pick(urls: list[str], episode_id: str | None, attempt: int) -> str:
    """The upstream of an episode's call (its first attempt: by the id's hash, so the
    prefix cache sees the whole conversation; each retry: the next one)."""
    return urls[(zlib.crc32((episode_id or "").encode()) + attempt) % len(urls)]


def backoff_s(attempt: int) -> float:
    """The wait before retry ``attempt`` (1, 2, ...): doubling, bounded."""
    return float(min(BACKOFF_S * 2 ** (attempt - 1), BACKOFF_MAX_S))


class Upstreams:
    def __init__(self, settings: GatewaySettings, on_retry: Callable[[], None]) -> None:
        self.urls = [url.rstrip("/") for url in settings.upstreams]
        self.max_bytes = settings.max_response_bytes
        self.timeout_s = settings.upstream_timeout_s
        self.retries = settings.upstream_retries
        self.on_retry = on_retry
        key = settings.upstream_api_key
        self.headers = {"Authorization": f"Bearer {key.reveal()}"} if key is not None else {}
        self.session: aiohttp.ClientSession | None = None
        #: The upstreams that refused the fields the gateway adds (``.refused``).
        self.refusing: set[str] = set()

    def refuses_fields(self, episode_id: str) -> bool:
        """Whether the upstream of this episode's calls refused the added fields."""
        return pick(self.urls, episode_id, 0) in self.refusing

    def refused_fields(self, episode_id: str, field: str) -> None:
        """Remember that the upstream of this episode's calls refused ``field``."""
        url = pick(self.urls, episode_id, 0)
        self.refusing.add(url)
        logs.event(
            log,
            "gateway.fields_refused",
            logging.WARNING,
            upstream=self.urls.index(url),
            field=field,
            effect="its calls are recorded without token ids from now on",
        )

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_read=self.timeout_s, connect=30),
            connector=aiohttp.TCPConnector(limit=0),
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    async def get(self, path: str) -> tuple[int, bytes, str]:
        """The first upstream's answer to a GET; UpstreamError when it cannot be
        reached, times out or answers too much."""
        assert self.session is not None
        timeout = aiohttp.ClientTimeout(total=self.timeout_s, connect=30)
        try:
            async with self.session.get(
                self.urls[0] + path, headers=self.headers, timeout=timeout
            ) as answer:
                body = await self._read(answer)
                return answer.status, body, answer.content_type
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(exc) from None

    @contextlib.asynccontextmanager
    async def _answer(
        self, path: str, body: Json, episode_id: str, request_id: str, **kw: Any
    ) -> AsyncIterator[aiohttp.ClientResponse]:
        """The upstream's answer to a POST, its status and headers read, retried
        while it could not be reached or answered 502-504 and retries are left."""
        assert self.session is not None
        headers = {**self.headers, "X-Request-Id": request_id, "Content-Type": "application/json"}
        data = wire.encode(body)
        answered = False
        for attempt in range(self.retries + 1):
            if attempt:
                self.on_retry()
                await asyncio.sleep(backoff_s(attempt))
            url = pick(self.urls, episode_id, attempt) + path
            try:
                async with self.session.post(url, data=data, headers=headers, **kw) as answer:
                    if answer.status in RETRIED_STATUSES and attempt < self.retries:
                        continue
                    answered = True
                    yield answer
                    return
            except RETRIED_ERRORS:
                if answered or attempt == self.retries:
                    raise

    async def post(self, path: str, body: Json, episode_id: str, request_id: str) -> Json | Failure:
        """The decoded answer, or the upstream's failure; UpstreamError when it
        cannot be reached, times out, or answers too much or not JSON."""
        timeout = aiohttp.ClientTimeout(total=self.timeout_s, connect=30)
        try:
            async with self._answer(path, body, episode_id, request_id, timeout=timeout) as answer:
                data = await self._read(answer)
                if answer.status != 200:
                    return Failure(answer.status, data, answer.content_type)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(exc) from None
        try:
            decoded: Json = wire.decode(data)
        except ValueError:
            raise UpstreamError("the upstream's answer is not JSON") from None
        return decoded

    async def stream(
        self, path: str, body: Json, episode_id: str, request_id: str
    ) -> AsyncGenerator[Json | Failure | None, None]:
        """The decoded chunks of a streamed answer (server-sent events), then None at
        ``[DONE]``; a Failure first and alone when the upstream refuses the call."""
        seen = 0
        try:
            async with self._answer(path, body, episode_id, request_id) as answer:
                if answer.status != 200:
                    yield Failure(answer.status, await self._read(answer), answer.content_type)
                    return
                async for line in answer.content:
                    seen += len(line)
                    if seen > self.max_bytes:
                        raise UpstreamError(f"the stream is larger than {self.max_bytes} bytes")
                    text = line.strip()
                    if not text.startswith(b"data:"):
                        continue
                    payload = text[5:].strip()
                    if payload == b"[DONE]":
                        yield None
                        return
                    try:
                        yield wire.decode(payload)
                    except ValueError:
                        raise UpstreamError("a chunk of the stream is not JSON") from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(exc) from None
        raise UpstreamError("the stream ended without [DONE]")

    async def _read(self, answer: aiohttp.ClientResponse) -> bytes:
        parts, size = [], 0
        async for part in answer.content.iter_chunked(1 << 16):
            size += len(part)
            if size > self.max_bytes:
                raise UpstreamError(f"the answer is larger than {self.max_bytes} bytes")
            parts.append(part)
        return b"".join(parts)


def _unreachable(exc: BaseException) -> UpstreamError:
    """The client's error for a failed exchange; the operator's log line has the rest."""
    logs.event(
        log, "gateway.upstream_failed", logging.WARNING, error=f"{type(exc).__name__}: {exc}"
    )
    if isinstance(exc, TimeoutError):
        return UpstreamError("the upstream did not answer in time", reason="upstream_timeout")
    return UpstreamError(f"cannot reach the upstream ({type(exc).__name__})")
