"""The token-plane benchmark's load: ``llm_call`` episodes as an agent serving its
model with vLLM sends them, generated from a seed (pure, no I/O).

An episode is a start, 2-8 model calls and an end. The first call's prompt is
1,000-2,000 tokens; each later call's prompt is the previous call's prompt and
completion plus 20-200 tokens (a tool result, a user turn, template glue), sent
as a delta (``prompt_base``: only the ids it adds). A prompt that would grow past
4,096 tokens is compacted instead: a fresh 1,000-2,000-token prompt, sent whole
(a segment break, as a context compaction makes one). Completions are 100-1,000
tokens with one logprob each: negative floats computed in float32 and sent as
doubles (vLLM's ``logprob`` values: ``-0.0031180522...`` with all their digits).
Token ids are drawn from a 151,936-token vocabulary (Qwen's). The request
messages are sent whole each call, as OpenAI clients send them, with short texts:
the benchmark is about the token arrays.

The JSON is built by hand (dicts, not the project's types): the load is what a
foreign producer sends. Episodes interleave: up to ``window`` are under way at
once, one event of one of them at a time, each episode's events in order.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

VOCAB: Final = 151_936
MAX_PROMPT: Final = 4096
CALLS: Final = (2, 8)
FIRST_PROMPT: Final = (1000, 2000)
ADDED: Final = (20, 200)
COMPLETION: Final = (100, 1000)
_F32: Final = struct.Struct("<f")
_encode: Final = msgspec.json.Encoder().encode

Message = tuple[bytes, bytes]


@dataclass(frozen=True, slots=True)
class Call:
    """One model call as the agent saw it: its whole prompt, what it sampled."""

    prompt: list[int]
    completion: list[int]
    logprobs: list[float]
    version: int
    #: Sent as a delta against the previous call (only ``prompt[base_len:]``).
    delta: bool


@dataclass(slots=True)
class TokenLoad:
    """The messages, in the order to send them, and what the output must hold."""

    messages: list[Message] = field(default_factory=list)
    #: episode id -> number of steps (every episode ends)
    ended: dict[str, int] = field(default_factory=dict)
    #: rows of the ``tokens`` format (token segments) over all episodes
    rows: int = 0
    #: tokens in those rows (their ``input_ids``)
    tokens: int = 0
    calls: int = 0
    #: calls sent as deltas
    deltas: int = 0

    @property
    def episodes(self) -> int:
        return len(self.ended)

    @property
    def bytes(self) -> int:
        return sum(len(v) for _, v in self.messages)


def _logprob(rng: random.Random) -> float:
    """A sampled token's logprob: mostly near 0, sometimes a few nats, float32."""
    x = -8.0 * rng.random() ** 4
    return float(_F32.unpack(_F32.pack(x))[0])


def conversation(rng: random.Random, count: int = 0) -> list[Call]:
    """One episode's model calls (``count`` of them, or 2-8)."""
    calls: list[Call] = []
    for _ in range(count or rng.randint(*CALLS)):
        prev = calls[-1] if calls else None
        prompt: list[int] = []
        if prev is not None:
            added = [rng.randrange(VOCAB) for _ in range(rng.randint(*ADDED))]
            prompt = prev.prompt + prev.completion + added
        delta = 0 < len(prompt) <= MAX_PROMPT
        if not delta:
            prompt = [rng.randrange(VOCAB) for _ in range(rng.randint(*FIRST_PROMPT))]
        completion = [rng.randrange(VOCAB) for _ in range(rng.randint(*COMPLETION))]
        logprobs = [_logprob(rng) for _ in completion]
        version = 100 + len(calls) // 3
        calls.append(Call(prompt, completion, logprobs, version, delta))
    return calls


def segments(calls: list[Call]) -> list[int]:
    """The tokens of each segment the calls make: a call sent whole starts one."""
    out: list[int] = []
    for call in calls:
        if not call.delta:
            out.append(0)
        out[-1] = len(call.prompt) + len(call.completion)
    return out


def _messages(seq: int) -> list[dict[str, Any]]:
    """The request messages of call ``seq``: the whole conversation so far."""
    out: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a coding agent. Use the tools."},
        {"role": "user", "content": "Fix the failing test in the repository."},
    ]
    for k in range(seq):
        call_id = f"call_{k}"
        function = {"name": "run", "arguments": f'{{"cmd":"pytest -x tests/test_{k}.py"}}'}
        out.append(
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"id": call_id, "type": "function", "function": function}],
            }
        )
        out.append({"role": "tool", "content": f"exit 1: test_{k} failed", "tool_call_id": call_id})
    return out


def events(eid: str, calls: list[Call], now: float) -> list[bytes]:
    """An episode's messages as hand-built JSON."""
    out = [
        {
            "type": "start",
            "v": 1,
            "episode_id": eid,
            "time": now,
            "agent_id": "bench",
            "prompt": "Fix the test.",
        }
    ]
    for seq, c in enumerate(calls):
        call: dict[str, Any] = {
            "request": {"messages": _messages(seq)},
            "response": {"content": "", "reasoning": "Run the test.", "tool_calls": None},
            "prompt_token_ids": c.prompt,
            "completion_token_ids": c.completion,
            "logprobs": c.logprobs,
            "model": "Qwen/Qwen3-8B",
            "weight_version": c.version,
            "finish_reason": "tool_calls",
            "request_id": f"chatcmpl-{eid}-{seq}",
            "usage": {"prompt_tokens": len(c.prompt), "completion_tokens": len(c.completion)},
        }
        if c.delta:
            prev = calls[seq - 1]
            call["prompt_token_ids"] = c.prompt[len(prev.prompt) + len(prev.completion) :]
            call["prompt_base"] = seq - 1
        step = {"type": "step", "v": 1, "episode_id": eid, "time": now + seq + 1, "seq": seq}
        out.append({**step, "kind": "llm_call", "call": call})
    end = {"type": "end", "v": 1, "episode_id": eid, "time": now + len(calls) + 1}
    out.append({**end, "steps": len(calls), "outcome": "success", "reward": 1.0})
    return [_encode(e) for e in out]


def generate(episodes: int, seed: int, now: float, window: int = 50) -> TokenLoad:
    """``episodes`` episodes from ``seed``, stamped from ``now``, interleaved."""
    rng = random.Random(seed)
    load = TokenLoad()
    pending: list[tuple[bytes, list[bytes]]] = []
    made = 0
    while made < episodes or pending:
        while made < episodes and len(pending) < window:
            eid = f"tok-{seed}-{made}"
            calls = conversation(rng)
            load.ended[eid] = len(calls)
            sizes = segments(calls)
            load.rows += len(sizes)
            load.tokens += sum(sizes)
            load.calls += len(calls)
            load.deltas += sum(c.delta for c in calls)
            pending.append((eid.encode(), events(eid, calls, now)[::-1]))
            made += 1
        i = rng.randrange(len(pending))
        key, left = pending[i]
        load.messages.append((key, left.pop()))
        if not left:
            pending[i] = pending[-1]
            pending.pop()
    return load


def unended(episodes: int, calls: int, seed: int, now: float) -> list[Message]:
    """A start and ``calls`` calls of each of ``episodes`` episodes, none ended, in
    episode order (many open episodes: ``bench.open_episodes --token-calls``)."""
    rng = random.Random(seed)
    out: list[Message] = []
    for n in range(episodes):
        eid = f"open-{n}"
        sent = events(eid, conversation(rng, calls), now)[:-1]
        out += [(eid.encode(), value) for value in sent]
    return out
