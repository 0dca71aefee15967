"""Kubelet-style probes while other clients flood the worker's HTTP endpoints.

The flood is open-loop, as many independent clients are: a new request every
1/rate seconds per path whether or not the earlier ones were answered, each
given up after TIMEOUT_S (so abandoned requests pile up on the server, as a
misbehaving client's do). The prober is the kubelet: a new connection per
probe, the same timeout, and the answer's status and body recorded. Each side
can send from its own loopback address (Linux answers all of 127.0.0.0/8), so
the server sees two clients.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp

#: Every request is given up after this long: the issue's bar for a probe's answer.
TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Probe:
    path: str
    #: 0 when no answer came within the timeout (or the connection failed)
    status: int
    body: bytes
    took_s: float


@dataclass
class Flood:
    sent: int = 0
    answered: int = 0
    #: given up after the timeout: the flood outran the server's pacing
    timed_out: int = 0
    tasks: set[asyncio.Task[None]] = field(default_factory=set)


async def _get(session: aiohttp.ClientSession, url: str) -> tuple[int, bytes, float]:
    began = time.monotonic()
    try:
        async with asyncio.timeout(TIMEOUT_S):
            async with session.get(url) as response:
                body = await response.read()
                return response.status, body, time.monotonic() - began
    except (TimeoutError, aiohttp.ClientError):
        return 0, b"", time.monotonic() - began


def _session(source: str) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, force_close=True, local_addr=(source, 0))
    return aiohttp.ClientSession(connector=connector)


async def flood(
    url: str,
    paths: tuple[str, ...],
    *,
    rate: float,
    stop: asyncio.Event,
    source: str = "127.0.0.2",
) -> Flood:
    """GET each of ``paths`` ``rate`` times a second until ``stop`` is set."""
    done = Flood()
    async with _session(source) as session:

        async def one(path: str) -> None:
            status, _, _ = await _get(session, url + path)
            done.answered += status != 0
            done.timed_out += status == 0

        began = time.monotonic()
        while not stop.is_set():
            for path in paths:
                task = asyncio.create_task(one(path))
                done.tasks.add(task)
                task.add_done_callback(done.tasks.discard)
                done.sent += 1
            wait = began + done.sent / len(paths) / rate - time.monotonic()
            await asyncio.sleep(max(wait, 0))
        await asyncio.gather(*done.tasks)
    return done


async def kubelet(
    url: str,
    paths: tuple[str, ...],
    *,
    probes: int,
    every_s: float,
    source: str = "127.0.0.1",
) -> list[Probe]:
    """``probes`` probes, ``every_s`` apart, cycling through ``paths``."""
    answers: list[Probe] = []
    async with _session(source) as session:
        for i in range(probes):
            path = paths[i % len(paths)]
            answers.append(Probe(path, *await _get(session, url + path)))
            await asyncio.sleep(every_s)
    return answers


async def probes_under_flood(
    flooded: list[str],
    probed: str,
    *,
    rate: float,
    warm_up_s: float,
    probes: int,
    every_s: float = 0.25,
) -> tuple[list[Probe], list[Flood]]:
    """Flood /healthz and /readyz at each of ``flooded`` (``rate`` each per second) and,
    once the floods have run ``warm_up_s``, probe /healthz and /readyz at ``probed``."""
    paths = ("/healthz", "/readyz")
    stop = asyncio.Event()
    floods = [asyncio.create_task(flood(url, paths, rate=rate, stop=stop)) for url in flooded]
    try:
        await asyncio.sleep(warm_up_s)
        answers = await kubelet(probed, paths, probes=probes, every_s=every_s)
    finally:
        stop.set()
    return answers, list(await asyncio.gather(*floods))
