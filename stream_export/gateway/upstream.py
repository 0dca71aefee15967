"""The gateway's side of the inference servers: one aiohttp session, bounded answers.

An episode's calls all go to the same upstream (chosen by a hash of its id), so
the server's prefix cache sees the whole conversation. Nothing is retried: a
call the upstream failed is the client's to send again, and it is then a new
call (never a second recording of the same one).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import AsyncGenerator
from dataclasses import dataclass
from typing import Any

import aiohttp

from stream_export.errors import UpstreamError
from stream_export.gateway_settings import GatewaySettings

Json = dict[str, Any]


@dataclass
class Failure:
    """An upstream's error answer, passed on to the client as it is."""

    status: int
    body: bytes
    content_type: str


class Upstreams:
    def __init__(self, settings: GatewaySettings) -> None:
        self.urls = [url.rstrip("/") for url in settings.upstreams]
        self.max_bytes = settings.max_response_bytes
        self.timeout_s = settings.upstream_timeout_s
        key = settings.upstream_api_key
        self.headers = {"Authorization": f"Bearer {key.reveal()}"} if key is not None else {}
        self.session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self.session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_read=self.timeout_s, connect=30),
            connector=aiohttp.TCPConnector(limit=0),
        )

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()

    def url(self, path: str, episode_id: str | None) -> str:
        base = self.urls[zlib.crc32((episode_id or "").encode()) % len(self.urls)]
        return base + path

    async def get(self, path: str) -> tuple[int, bytes, str]:
        assert self.session is not None
        async with self.session.get(self.url(path, None), headers=self.headers) as answer:
            body = await self._read(answer)
            return answer.status, body, answer.content_type

    async def post(self, path: str, body: Json, episode_id: str) -> Json | Failure:
        """The decoded answer, or the upstream's failure; UpstreamError when it
        cannot be reached, times out, or answers too much or not JSON."""
        assert self.session is not None
        try:
            async with self.session.post(
                self.url(path, episode_id),
                json=body,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=self.timeout_s, connect=30),
            ) as answer:
                data = await self._read(answer)
                if answer.status != 200:
                    return Failure(answer.status, data, answer.content_type)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _unreachable(exc) from None
        try:
            decoded: Json = json.loads(data)
        except ValueError:
            raise UpstreamError("the upstream's answer is not JSON") from None
        return decoded

    async def stream(
        self, path: str, body: Json, episode_id: str
    ) -> AsyncGenerator[Json | Failure | None, None]:
        """The decoded chunks of a streamed answer (server-sent events), then None at
        ``[DONE]``; a Failure first and alone when the upstream refuses the call."""
        assert self.session is not None
        seen = 0
        try:
            async with self.session.post(
                self.url(path, episode_id), json=body, headers=self.headers
            ) as answer:
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
                        yield json.loads(payload)
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
    if isinstance(exc, TimeoutError):
        return UpstreamError("the upstream did not answer in time", reason="upstream_timeout")
    return UpstreamError(f"cannot reach the upstream: {type(exc).__name__}: {exc}")
