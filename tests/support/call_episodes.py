"""Finished episodes of model calls for the format tests: a tool-calling
conversation as an agent sends it (OpenAI messages, prompts after the first sent
as deltas), put together by the assembler's own token plane, and the calls' full
prompts the rows must match."""

from __future__ import annotations

from typing import Any

import msgspec

from stream_export.assemble.tokens import token_plane
from stream_export.contract.calls import LlmCall, WeightVersion
from stream_export.contract.episode import Episode
from stream_export.contract.events import ChatMessage, Step

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "open_door",
            "description": "Open a door.",
            "parameters": {"type": "object", "properties": {"direction": {"type": "string"}}},
        },
    }
]
SYSTEM = {"role": "system", "content": "You are in a dark room."}
USER = {"role": "user", "content": "Get out."}
CALL_1 = {"id": "call_1", "function": {"name": "open_door", "arguments": '{"direction":"north"}'}}
FIRST = {"content": "", "reasoning": "A door north.", "tool_calls": [CALL_1]}
SECOND = {"content": "I am out.", "reasoning": "It opened."}
TOOL = {"role": "tool", "content": "It is open.", "tool_call_id": "call_1"}


def _call(
    messages: list[dict[str, Any]],
    response: dict[str, Any],
    prompt: list[int],
    completion: list[int],
    version: WeightVersion,
    base: int | None,
) -> LlmCall:
    call = {
        "request": {"messages": messages, "tools": TOOLS},
        "response": response,
        "prompt_token_ids": prompt,
        "completion_token_ids": completion,
        "logprobs": [-0.25 * (i + 1) for i in range(len(completion))],
        "model": "tiny",
        "weight_version": version,
        "finish_reason": "tool_calls" if response.get("tool_calls") else "stop",
        "request_id": f"req-{len(messages)}",
        "prompt_base": base,
    }
    return msgspec.convert(call, LlmCall)


def full_prompts(offset: int = 0) -> list[tuple[list[int], list[int]]]:
    """The (prompt, completion) ids of the tool episode's two calls, whole."""
    first = [1 + offset, 2, 3, 4]
    answer = [10 + offset, 11, 12]
    second = [*first, *answer, 20, 21, 22]
    return [(first, answer), (second, [30 + offset, 31])]


def tool_episode(
    eid: str = "tools-1",
    *,
    versions: tuple[WeightVersion, WeightVersion] = (3, 4),
    reward: float | None = 1.0,
    group_id: str | None = None,
    offset: int = 0,
) -> Episode:
    """A two-call episode: the model calls a tool, reads its answer, answers; the
    second call's prompt is sent as a delta against the first."""
    (p1, c1), (p2, c2) = full_prompts(offset)
    answered = {"role": "assistant", "content": "", "tool_calls": [CALL_1]}
    calls = [
        _call([SYSTEM, USER], FIRST, p1, c1, versions[0], None),
        _call([SYSTEM, USER, answered, TOOL], SECOND, p2[len(p1) + len(c1) :], c2, versions[1], 1),
    ]
    steps = [
        Step(episode_id=eid, time=10.0, seq=0, kind="thought", content="Let me look."),
        *(
            Step(episode_id=eid, time=11.0 + i, seq=1 + i, kind="llm_call", call=call)
            for i, call in enumerate(calls)
        ),
    ]
    plane = token_plane(steps)
    assert plane is not None
    return Episode(
        episode_id=eid,
        agent_id="agent",
        prompt=[ChatMessage(role="user", content="Get out.")],
        steps=plane.steps,
        start_time=9.0,
        end_time=13.0,
        outcome="success",
        reward=reward,
        group_id=group_id,
        metadata={"domain": "rooms"},
        tokens=plane.tokens,
    )
