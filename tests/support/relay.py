"""A slow pass-through to an OpenAI-compatible server, in a process of its own so a
test can kill it (-9) mid-stream: what a gateway sees when its upstream dies. It
passes each streamed line on ``--delay`` seconds after the previous one.

    python -m tests.support.relay --port N --to http://127.0.0.1:8000 [--delay 0.05]

``running(upstream)`` starts it for a test.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import aiohttp
from aiohttp import web

from tests.support.monitoring import ROOT, free_port
from tests.support.waiting import wait_for


@contextmanager
def running(upstream: str) -> Iterator[tuple[str, Callable[[], None]]]:
    """A slow pass-through to ``upstream`` in its own process: its URL, and what kills it."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.support.relay", "--port", str(port), "--to", upstream],
        cwd=ROOT,
        start_new_session=True,
    )

    def kill() -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)

    try:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: _listening(port) or proc.poll() is not None, timeout=30, what="relay")
        assert proc.poll() is None
        yield url, kill
    finally:
        kill()


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--to", required=True)
    p.add_argument("--delay", type=float, default=0.05)
    args = p.parse_args()

    async def relay(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        headers = {"Content-Type": "application/json"}
        async with (
            aiohttp.ClientSession() as session,
            session.post(args.to + request.path, data=body, headers=headers) as answer,
        ):
            response = web.StreamResponse(status=answer.status, headers={**answer.headers})
            response.headers.popall("Content-Length", None)
            response.headers.popall("Transfer-Encoding", None)
            await response.prepare(request)
            async for line in answer.content:
                await response.write(line)
                await asyncio.sleep(args.delay)
            await response.write_eof()
            return response

    app = web.Application()
    app.router.add_post("/v1/chat/completions", relay)
    web.run_app(app, host="127.0.0.1", port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
