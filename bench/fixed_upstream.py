"""A fixed-answer upstream for ``python -m bench.gateway``: an OpenAI-compatible
server that answers every chat completion at once with the same 16-token
completion, in vLLM's shape (never in CI; not an inference server).

The overhead benchmark measures what a proxy adds per call, so the upstream must
cost next to nothing (LiteLLM's own benchmarks use such a fake endpoint too). It
answers as vLLM 0.32 does, field for field: ``prompt_token_ids`` at the top level
(a stream: in its first chunk) and ``choices[].token_ids`` when the request says
``return_token_ids``, the sampled tokens' logprobs in ``logprobs.content`` when it
says ``logprobs``, ``null`` otherwise; so the gateway does all of its work
(token capture, the ``llm_call`` event, the Kafka acknowledgement) while a direct
client and LiteLLM get an ordinary answer.

    python -m bench.fixed_upstream --port N      serve /v1/models, /v1/chat/completions

Only ``/v1/chat/completions`` is served; ``messages`` are not read (the prompt ids
are fixed too).
"""

from __future__ import annotations

import argparse
import itertools
import json
import struct
from typing import Any, Final

from aiohttp import web

Json = dict[str, Any]
MODEL: Final = "tiny"
CREATED: Final = 1796541043
FINGERPRINT: Final = "vllm-0.32.0-fixed"
#: The completion: (token text, token id, logprob) per sampled token.
COMPLETION: Final = tuple(
    (
        text,
        300 + i,
        struct.unpack("<f", struct.pack("<f", -0.05 - 0.37 * (i % 5)))[0],
    )
    for i, text in enumerate(
        (
            *(" The", " weather", " in", " Oslo", " is", " cold", " and", " clear", " today"),
            *(",", " with", " light", " wind", " from", " the", " north"),
        )
    )
)
PROMPT_TOKEN_IDS: Final = (1, 301, 201, *range(400, 424), 2, 201, 1, 306, 201)
_ID: Final = "chatcmpl-{:016x}"


def _logprobs(tokens: tuple[tuple[str, int, float], ...]) -> Json:
    return {
        "content": [
            {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
            for t, _, lp in tokens
        ]
    }


def _usage() -> Json:
    prompt, completion = len(PROMPT_TOKEN_IDS), len(COMPLETION)
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }


def answer(body: Json, number: int) -> Json:
    """The whole (non-streaming) answer to a chat request, as vLLM gives it."""
    ids, logprobs = bool(body.get("return_token_ids")), bool(body.get("logprobs"))
    message = {
        "role": "assistant",
        "content": "".join(t for t, _, _ in COMPLETION),
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
        "reasoning": None,
    }
    choice = {
        "index": 0,
        "message": message,
        "logprobs": _logprobs(COMPLETION) if logprobs else None,
        "finish_reason": "length",
        "stop_reason": None,
        "token_ids": [i for _, i, _ in COMPLETION] if ids else None,
        "routed_experts": None,
    }
    return {
        "id": _ID.format(number),
        "object": "chat.completion",
        "created": CREATED,
        "model": MODEL,
        "choices": [choice],
        "service_tier": None,
        "system_fingerprint": FINGERPRINT,
        "usage": _usage(),
        "prompt_logprobs": None,
        "prompt_token_ids": list(PROMPT_TOKEN_IDS) if ids else None,
        "prompt_text": None,
        "kv_transfer_params": None,
        "ec_transfer_params": None,
        "metrics": None,
    }


def chunks(body: Json, number: int) -> list[Json]:
    """The chunks of a streamed answer (before ``[DONE]``), as vLLM sends them: the
    role first (with the prompt ids), then a token a chunk, the last one with the
    finish reason, and a usage chunk when ``stream_options.include_usage``."""
    ids, logprobs = bool(body.get("return_token_ids")), bool(body.get("logprobs"))
    head = {"id": _ID.format(number), "object": "chat.completion.chunk", "created": CREATED}
    head["model"] = MODEL
    role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
    out: list[Json] = [
        {
            **head,
            "choices": [{**role, "logprobs": None, "finish_reason": None}],
            "prompt_token_ids": list(PROMPT_TOKEN_IDS) if ids else None,
            "prompt_text": None,
        }
    ]
    for k, token in enumerate(COMPLETION):
        last = k == len(COMPLETION) - 1
        choice: Json = {
            "index": 0,
            "delta": {"content": token[0]},
            "logprobs": _logprobs((token,)) if logprobs else None,
            "finish_reason": "length" if last else None,
        }
        if last:
            choice["stop_reason"] = None
        choice["token_ids"] = [token[1]] if ids else None
        chunk = {**head, "choices": [choice]}
        if last:
            chunk["system_fingerprint"] = FINGERPRINT
        out.append(chunk)
    if (body.get("stream_options") or {}).get("include_usage"):
        out.append({**head, "choices": [], "usage": _usage()})
    return out


def _dumps(value: Json) -> str:
    return json.dumps(value, separators=(",", ":"))


def sse(chunks: list[Json]) -> bytes:
    """A stream's bytes: each chunk as a server-sent event, then ``[DONE]``."""
    events = [b"data: " + _dumps(c).encode() + b"\n\n" for c in chunks]
    return b"".join(events) + b"data: [DONE]\n\n"


class Upstream:
    """The aiohttp application; answers are numbered for their ids."""

    def __init__(self) -> None:
        self.numbers = itertools.count(1)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.chat)
        return app

    async def models(self, request: web.Request) -> web.Response:
        listed = {"object": "list", "data": [{"id": MODEL, "object": "model", "owned_by": "bench"}]}
        return web.json_response(listed)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        number = next(self.numbers)
        if not body.get("stream"):
            return web.json_response(answer(body, number), dumps=_dumps)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        await response.write(sse(chunks(body, number)))
        await response.write_eof()
        return response


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m bench.fixed_upstream", description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    args = p.parse_args(argv)
    web.run_app(Upstream().app(), host=args.host, port=args.port, access_log=None, print=None)


if __name__ == "__main__":
    main()
