"""A scripted OpenAI-compatible upstream that plays the model of a Daydreams
dark-room agent (integrations/daydreams/test/dark-room.ts).

It answers ``/v1/chat/completions``, streamed or whole, in Daydreams' own output
format: the text after the ``<response>`` prefill Daydreams sends as the last
(assistant) message. While the rendered prompt shows no result of the
``open_door`` action it reasons and calls the action; once it does, it reasons
and answers with a ``text`` output. The text is the seed's dark-room record
(tests/golden/seed.jsonl), so a test can compare the records field by field.

Like vLLM it answers ``return_token_ids`` with token ids (here the UTF-8 bytes of
the prompt and of each streamed piece) and ``logprobs`` with one logprob per
token. ``strict=True`` behaves like a hosted API instead: a request field it does
not know is refused with OpenAI's 400 (``Unrecognized request argument supplied:
return_token_ids``) and no token ids are returned. ``fail_next`` makes the next
calls fail in one of the ``FAULTS``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from aiohttp import web

from tests.support.in_thread import in_thread
from tests.support.monitoring import free_port

Json = dict[str, Any]
Fault = Literal["die_mid_stream", "null_logprobs", "null_logprob_entries"]
FAULTS: Final[tuple[Fault, ...]] = ("die_mid_stream", "null_logprobs", "null_logprob_entries")

TASK: Final = "You are in a dark room with a door to the north."
REASONING: Final = "I need to find a way out. I should check if the door is locked."
ARGUMENTS: Final = {"direction": "north"}
#: What the test agent's open_door action answers (the seed's result paragraph).
RESULT: Final = "I found the door was unlocked and was able to exit the room."
FINAL_REASONING: Final = "The door was unlocked and I left the room."
OUTPUT: Final = "I am out of the dark room."

#: The first answer: reason, then call the action.
ACT: Final = (
    f"<reasoning>{REASONING}</reasoning>\n"
    f'<action_call name="open_door">{json.dumps(ARGUMENTS)}</action_call>\n'
    "</response>"
)
#: The answer once the prompt shows the action's result.
FINISH: Final = (
    f'<reasoning>{FINAL_REASONING}</reasoning>\n<output name="text">{OUTPUT}</output>\n</response>'
)

#: Request fields of OpenAI's chat completions API (what ``strict`` accepts).
OPENAI_FIELDS: Final = frozenset(
    {
        "audio", "frequency_penalty", "function_call", "functions", "logit_bias",
        "logprobs", "max_completion_tokens", "max_tokens", "messages", "metadata",
        "modalities", "model", "n", "parallel_tool_calls", "prediction",
        "presence_penalty", "prompt_cache_key", "reasoning_effort", "response_format",
        "safety_identifier", "seed", "service_tier", "stop", "store", "stream",
        "stream_options", "temperature", "tool_choice", "tools", "top_logprobs", "top_p",
        "user", "verbosity", "web_search_options",
    }
)  # fmt: skip
#: Characters per streamed piece: small, so Daydreams' parser sees tags cut in two.
PIECE: Final = 7


def prompt_text(messages: list[Json]) -> str:
    """The request's messages as one text (the text parts of content-part lists)."""
    parts = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        parts.append(f"{message.get('role')}: {content or ''}")
    return "\n".join(parts)


#: How Daydreams renders an open_door result in the prompt's recent action results.
SHOWN_RESULT: Final = re.compile(r'<action_result [^>]*name="open_door"')


def answer_for(prompt: str) -> str:
    """The dark-room agent's next answer: act until the action's result shows."""
    return FINISH if SHOWN_RESULT.search(prompt) else ACT


def unknown_fields_error(fields: list[str]) -> Json:
    """OpenAI's answer to request fields it does not know (a 400)."""
    plural = "s" if len(fields) > 1 else ""
    return {
        "error": {
            "message": f"Unrecognized request argument{plural} supplied: {', '.join(fields)}",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        }
    }


def logprob(index: int) -> float:
    """A deterministic logprob for the index-th completion token."""
    return -((index % 7) + 1) / 8


@dataclass
class Exchange:
    """One chat request and the text answered (what a test compares with)."""

    request: Json
    status: int
    text: str = ""
    fault: Fault | None = None


@dataclass
class DaydreamsUpstream:
    """The scripted upstream; ``url`` is the base URL (with ``/v1``) to give the gateway."""

    strict: bool = False
    model: str = "dark-room"
    port: int = field(default_factory=free_port)
    exchanges: list[Exchange] = field(default_factory=list)
    _faults: list[Fault] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def fail_next(self, fault: Fault, times: int = 1) -> None:
        """Answer the next ``times`` chat calls with ``fault``."""
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        self._faults += [fault] * times

    async def handle_models(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "test"}]}
        )

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if self.strict and (unknown := sorted(set(body) - OPENAI_FIELDS)):
            self.exchanges.append(Exchange(body, 400))
            return web.json_response(unknown_fields_error(unknown), status=400)
        fault = self._faults.pop(0) if self._faults else None
        prompt = prompt_text(body.get("messages") or [])
        text = answer_for(prompt)
        self.exchanges.append(Exchange(body, 200, text, fault))
        ids = bool(body.get("return_token_ids")) and not self.strict
        pieces = [text[i : i + PIECE] for i in range(0, len(text), PIECE)]
        if body.get("stream"):
            return await self._stream(request, body, prompt, pieces, ids, fault)
        if fault == "die_mid_stream":
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=500)  # never reaches the client
        return web.json_response(self._whole(body, prompt, pieces, ids, fault))

    def _envelope(self, request_id: str) -> Json:
        return {"id": request_id, "created": int(time.time()), "model": self.model}

    def _logprobs(self, pieces: list[str], start: int, fault: Fault | None) -> Json | None:
        if fault == "null_logprobs":
            return None
        content: list[Json] = []
        for piece in pieces:
            for token in piece.encode():
                value = None if fault == "null_logprob_entries" else logprob(start)
                content.append({"token": f"bytes:{token}", "logprob": value, "top_logprobs": []})
                start += 1
        return {"content": content}

    def _whole(
        self, body: Json, prompt: str, pieces: list[str], ids: bool, fault: Fault | None
    ) -> Json:
        choice: Json = {
            "index": 0,
            "message": {"role": "assistant", "content": "".join(pieces)},
            "finish_reason": "stop",
            "logprobs": self._logprobs(pieces, 0, fault) if body.get("logprobs") else None,
        }
        answer = {
            **self._envelope(f"chatcmpl-{len(self.exchanges)}"),
            "object": "chat.completion",
            "choices": [choice],
            "usage": self._usage(prompt, pieces),
        }
        if ids:
            answer["prompt_token_ids"] = list(prompt.encode())
            choice["token_ids"] = list("".join(pieces).encode())
        return answer

    def _usage(self, prompt: str, pieces: list[str]) -> Json:
        completion = len("".join(pieces).encode())
        prompt_tokens = len(prompt.encode())
        return {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion,
        }

    async def _stream(
        self,
        request: web.Request,
        body: Json,
        prompt: str,
        pieces: list[str],
        ids: bool,
        fault: Fault | None,
    ) -> web.StreamResponse:
        reply = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await reply.prepare(request)
        envelope = {
            **self._envelope(f"chatcmpl-{len(self.exchanges)}"),
            "object": "chat.completion.chunk",
        }
        sent = 0
        for index, piece in enumerate(pieces):
            if fault == "die_mid_stream" and index == len(pieces) // 2:
                assert request.transport is not None
                request.transport.close()  # no finish_reason, no [DONE]
                return reply
            choice: Json = {"index": 0, "delta": {"content": piece}, "finish_reason": None}
            if index == 0:
                choice["delta"]["role"] = "assistant"
            if body.get("logprobs"):
                choice["logprobs"] = self._logprobs([piece], sent, fault)
            chunk: Json = {**envelope, "choices": [choice]}
            if ids:
                choice["token_ids"] = list(piece.encode())
                if index == 0:
                    chunk["prompt_token_ids"] = list(prompt.encode())
            sent += len(piece.encode())
            await reply.write(f"data: {json.dumps(chunk)}\n\n".encode())
        last: Json = {**envelope, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
        if (body.get("stream_options") or {}).get("include_usage"):
            last["usage"] = self._usage(prompt, pieces)
        await reply.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
        with contextlib.suppress(ConnectionResetError):
            await reply.write_eof()
        return reply

    async def serve(self, ready: threading.Event, stop: asyncio.Event) -> None:
        app = web.Application(client_max_size=64 << 20)
        app.router.add_get("/v1/models", self.handle_models)
        app.router.add_post("/v1/chat/completions", self.handle_chat)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()
        ready.set()
        try:
            await stop.wait()
        finally:
            await runner.cleanup()


def serving(strict: bool = False) -> AbstractContextManager[DaydreamsUpstream]:
    """The scripted upstream, serving from a thread of its own until the block ends."""
    return in_thread(DaydreamsUpstream(strict=strict), "the scripted Daydreams upstream")
