"""A recording pass-through between the gateway and vLLM, owned by the test: every
request the gateway sends upstream and the bytes vLLM answered, whole or streamed,
kept as they went by. A test compares the training rows with what vLLM really
returned to each call, independently of the gateway's own view of it."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from tests.support.in_thread import in_thread
from tests.support.monitoring import free_port

Json = dict[str, Any]


@dataclass(frozen=True)
class Sampled:
    """What vLLM sampled for one chat call, read from its own answer."""

    prompt: list[int]
    completion: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass(frozen=True)
class Exchange:
    """One request the gateway sent upstream and vLLM's answer, byte for byte."""

    request: Json
    answer: bytes

    def sampled(self) -> Sampled:
        """The prompt ids, completion ids and logprobs vLLM returned to a chat call."""
        if not self.request.get("stream"):
            whole = json.loads(self.answer)
            (choice,) = whole["choices"]
            return Sampled(
                whole["prompt_token_ids"],
                choice["token_ids"],
                [e["logprob"] for e in choice["logprobs"]["content"]],
                choice["finish_reason"],
            )
        prompt: list[int] = []
        completion: list[int] = []
        logprobs: list[float] = []
        finish = ""
        for line in self.answer.splitlines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            prompt += chunk.get("prompt_token_ids") or []
            for choice in chunk["choices"]:
                completion += choice.get("token_ids") or []
                chosen = (choice.get("logprobs") or {}).get("content") or []
                logprobs += [entry["logprob"] for entry in chosen]
                finish = choice.get("finish_reason") or finish
        return Sampled(prompt, completion, logprobs, finish)


class UpstreamRecorder:
    """Forwards ``/v1/*`` to ``target`` (a base URL without ``/v1``), recording each
    exchange; ``url`` is the base URL to give the gateway as its upstream."""

    def __init__(self, target: str) -> None:
        self.target = target.rstrip("/")
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.exchanges: list[Exchange] = []
        self._session: aiohttp.ClientSession | None = None

    def answer_to(self, messages: list[Json]) -> Exchange:
        """The one chat exchange whose request carried exactly these messages."""
        found = [e for e in self.exchanges if e.request.get("messages") == messages]
        assert len(found) == 1, f"{len(found)} upstream calls carried these messages"
        return found[0]

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        async with self._session.request(
            request.method,
            self.target + request.path,
            data=body or None,
            headers={"Content-Type": request.headers.get("Content-Type", "application/json")},
        ) as answer:
            reply = web.StreamResponse(status=answer.status)
            reply.content_type = answer.content_type
            await reply.prepare(request)
            parts: list[bytes] = []
            async for part in answer.content.iter_any():
                if parts:
                    await reply.write(parts[-1])
                parts.append(part)
        # Filed before the last part goes on: the gateway has its whole answer only
        # then, so a test that saw its call answered finds the exchange on record.
        if request.method == "POST":
            self.exchanges.append(Exchange(json.loads(body), b"".join(parts)))
        # the gateway may close the connection at a stream's [DONE], before its end
        with contextlib.suppress(ConnectionResetError):
            if parts:
                await reply.write(parts[-1])
            await reply.write_eof()
        return reply

    async def serve(self, ready: threading.Event, stop: asyncio.Event) -> None:
        self._session = aiohttp.ClientSession()
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/v1/{tail:.*}", self._forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        ready.set()
        try:
            await stop.wait()
        finally:
            await runner.cleanup()
            await self._session.close()


def recording(target: str) -> AbstractContextManager[UpstreamRecorder]:
    """The recorder, serving from a thread of its own until the block ends."""
    return in_thread(UpstreamRecorder(target), "the upstream recorder")
