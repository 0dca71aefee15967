"""A slow pass-through to an OpenAI-compatible server, in a process of its own so a
test can kill it (-9) mid-stream: what a gateway sees when its upstream dies. It
passes each streamed line on ``--delay`` seconds after the previous one.

    python -m tests.support.relay --port N --to http://127.0.0.1:8000 [--delay 0.05]
"""

from __future__ import annotations

import argparse
import asyncio

import aiohttp
from aiohttp import web


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
