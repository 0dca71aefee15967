"""A long-context stand-in for vLLM, owned by a test or benchmark: its chat
completions tokenize like a byte-level model without running one (a prompt id
per UTF-8 byte of the messages' text, so a 33 KB prompt is 33k ids) and
answer at once with the same short completion, in vLLM's shape (``prompt_token_ids``,
``choices[].token_ids``, ``logprobs.content``). The test vLLM serves 512 tokens
at most; what the gateway keeps of an episode grows with its prompts, so its
state tests need prompts of tens of thousands of ids, and nothing else of vLLM.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final

from aiohttp import web

from tests.support.monitoring import free_port

Json = dict[str, Any]
#: The completion, sampled a byte a token (so a next prompt that holds this
#: answer continues this call's prompt + completion, as a delta).
COMPLETION: Final = " It is sunny."


#: A byte's id: past 256, as a real vocabulary's ids mostly are (Python shares
#: the objects of small ints, so ids below 257 would make lists of ids look smaller).
FIRST_ID: Final = 1000


def prompt_ids(body: Json) -> list[int]:
    """The prompt's ids: one per byte of every message's text content, in order."""
    messages = body.get("messages") or []
    text = "".join(m["content"] for m in messages if isinstance(m["content"], str))
    return [FIRST_ID + b for b in text.encode()]


def answer(body: Json, number: int) -> Json:
    """The whole answer to a chat request, with ids and logprobs when asked."""
    ids, logprobs = bool(body.get("return_token_ids")), bool(body.get("logprobs"))
    prompt = prompt_ids(body)
    completion = [FIRST_ID + b for b in COMPLETION.encode()]
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": COMPLETION},
        "logprobs": (
            {"content": [{"token": chr(i - FIRST_ID), "logprob": -0.5} for i in completion]}
            if logprobs
            else None
        ),
        "finish_reason": "length",
        "token_ids": completion if ids else None,
    }
    return {
        "id": f"chatcmpl-bytes-{number}",
        "object": "chat.completion",
        "model": "bytes",
        "choices": [choice],
        "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(completion)},
        "prompt_token_ids": prompt if ids else None,
    }


@contextmanager
def running() -> Iterator[str]:
    """The upstream on a loopback port, served from a thread; its base URL (``.../v1``)."""
    numbers = iter(range(1, 1 << 62))

    async def chat(request: web.Request) -> web.Response:
        return web.json_response(answer(await request.json(), next(numbers)))

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "bytes", "object": "model"}]})

    app = web.Application(client_max_size=64 << 20)
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    port = free_port()
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, name="byte-upstream", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}/v1"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
