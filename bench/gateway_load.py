"""The gateway benchmark's clients: closed-loop callers of one OpenAI-compatible
chat endpoint, each sending its next call when its last one is answered in full."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import aiohttp

#: What an agent sends: a short chat, a bounded completion.
REQUEST: Final = {
    "model": "tiny",
    "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the weather in Oslo today?"},
    ],
    "max_tokens": 16,
}


#: What the gateway asks of the upstream besides (the direct target that asks it too).
TOKENS: Final = {"logprobs": True, "return_token_ids": True}


def request_body(stream: bool, tokens: bool = False) -> bytes:
    """The request a client sends; ``tokens``: asking for ids and logprobs too."""
    return json.dumps(
        {**REQUEST, **(TOKENS if tokens else {}), **({"stream": True} if stream else {})}
    ).encode()


def answered(status: int, body: bytes, stream: bool) -> bool:
    """A whole, successful answer: a chat completion, or a stream through ``[DONE]``."""
    if status != 200:
        return False
    return body.rstrip().endswith(b"data: [DONE]") if stream else b'"choices"' in body


@dataclass
class Measured:
    """Latencies (s) of the calls sent within the window (each waited for to its
    end: sampling by start time favours no latency), the calls answered within
    it (whenever sent), and the calls that failed in it."""

    latencies: list[float] = field(default_factory=list)
    completed: int = 0
    errors: int = 0
    first_error: str = ""


@dataclass
class _Window:
    """Opens once every client has had an answer and the warm-up has passed."""

    clients: int
    warmed: int = 0
    all_warm: asyncio.Event = field(default_factory=asyncio.Event)
    opens: float = math.inf
    closes: float = math.inf


async def drive(
    urls: Sequence[str],
    headers: dict[str, str],
    stream: bool,
    warmup_s: float,
    seconds: float,
    window: Callable[[bool], Any] | None = None,
    tokens: bool = False,
) -> Measured:
    """One client per URL, calling until the window closes: it opens ``warmup_s``
    after the start, or later when a client has not had its first answer yet, and
    stays open ``seconds``. ``window(True)`` is called when it opens and
    ``window(False)`` when it closes (the target's CPU readings); ``tokens``: the
    calls ask for token ids and logprobs, as the gateway asks its upstream."""
    body = request_body(stream, tokens)
    headers = {"Content-Type": "application/json", **headers}
    out = Measured()
    w = _Window(len(urls))
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        start = time.perf_counter()

        async def client(url: str) -> None:
            first = True
            while (began := time.perf_counter()) < w.closes:
                failure = ""
                try:
                    async with session.post(url, data=body, headers=headers) as answer:
                        data = await answer.read()
                        if not answered(answer.status, data, stream):
                            failure = f"{answer.status}: {data[:300]!r}"
                except (aiohttp.ClientError, TimeoutError) as exc:
                    failure = f"{type(exc).__name__}: {exc}"
                end = time.perf_counter()
                if first:
                    first, w.warmed = False, w.warmed + 1
                    if w.warmed == w.clients:
                        w.all_warm.set()
                if failure:
                    if began >= w.opens:
                        out.errors += 1
                        out.first_error = out.first_error or failure
                    continue
                out.completed += w.opens <= end <= w.closes
                if w.opens <= began:
                    out.latencies.append(end - began)

        async def clock() -> None:
            await w.all_warm.wait()
            await asyncio.sleep(max(0.0, start + warmup_s - time.perf_counter()))
            w.opens = time.perf_counter()
            if window:
                window(True)
            await asyncio.sleep(seconds)
            w.closes = time.perf_counter()
            if window:
                window(False)

        await asyncio.gather(clock(), *(client(u) for u in urls))
    return out
