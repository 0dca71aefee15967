"""How an episode reads, for the text, conversational, messages and episode formats
(and the group outputs and the judge, which read episodes the same way).

The prompt is what the agent was given (chat messages are joined with a blank
line in the text format) followed by any observations before its first own step.
Agent steps are ``thought``, ``action``, ``output`` and ``message``;
``observation`` and ``action_result`` come from the environment. In text, each
step is one paragraph (parts are joined with a blank line), an action reads
``Action: <content>`` (or ``Action: name({arguments})`` when it has no content),
and a step without content shows its ``data`` as JSON.

A *decision* is a run of agent steps that ends with an action or an output (or
where the environment answers). At ``granularity = "step"`` each decision is one
record: its prompt is everything the agent had seen before it, its completion is
the decision's own steps. Pure.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgspec

from stream_export.contract.calls import LlmCall
from stream_export.contract.episode import Episode
from stream_export.contract.events import Prompt, Step

Record = dict[str, Any]


AGENT_KINDS: Final = frozenset({"thought", "action", "output", "message"})
_DECISION_ENDS: Final = frozenset({"action", "output"})
_SEP: Final = "\n\n"
_encoder: Final = msgspec.json.Encoder()


def json_text(value: Any) -> str:
    return _encoder.encode(value).decode()


def step_text(step: Step) -> str:
    """A step as one paragraph of the text format ("" when it has nothing to show)."""
    if step.kind == "action":
        if step.content:
            return f"Action: {step.content}"
        args = "" if step.arguments is None else json_text(step.arguments)
        return f"Action: {step.name or ''}({args})"
    if step.content or step.data is None:
        return step.content
    return json_text(step.data)


def decisions(steps: list[Step]) -> list[tuple[int, int]]:
    """``(start, end)`` slices of ``steps``, one per decision, in order."""
    spans: list[tuple[int, int]] = []
    start: int | None = None
    for i, step in enumerate(steps):
        if step.kind in AGENT_KINDS:
            if start is None:
                start = i
            if step.kind in _DECISION_ENDS:
                spans.append((start, i + 1))
                start = None
        elif start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(steps)))
    return spans


def join(parts: Iterable[str]) -> str:
    return _SEP.join(p for p in parts if p)


def prompt_text(prompt: Prompt) -> str:
    return prompt if isinstance(prompt, str) else join(m.content for m in prompt)


def _message(role: str, content: str, name: str | None = None) -> Record:
    return {"role": role, "content": content, "name": name}


def prompt_messages(prompt: Prompt) -> list[Record]:
    if isinstance(prompt, str):
        return [_message("user", prompt)]
    return [_message(m.role, m.content, m.name) for m in prompt]


def step_messages(steps: Iterable[Step]) -> list[Record]:
    """Chat messages for steps: consecutive agent steps form one assistant turn,
    action results are tool messages (named after the action), observations are
    user messages."""
    out: list[Record] = []
    merge = False
    for step in steps:
        text = step_text(step)
        if not text:
            continue
        if step.kind in AGENT_KINDS:
            if merge:
                out[-1]["content"] += _SEP + text
            else:
                out.append(_message("assistant", text))
            merge = True
            continue
        merge = False
        if step.kind == "action_result":
            out.append(_message("tool", text, step.name))
        else:
            out.append(_message("user", text))
    return out


def step_record(step: Step) -> Record:
    """A step in the ``episode`` format: the same keys in every step (null where it
    has none); an ``llm_call``'s ``call`` is its request, response and sampling
    facts, without the token arrays (the ``tokens`` format has them)."""
    return {
        "seq": step.seq,
        "time": float(step.time),
        "kind": step.kind,
        "content": step.content,
        "name": step.name,
        "arguments": step.arguments,
        "data": step.data,
        "id": step.id,
        "call": None if step.call is None else _call_record(step.call),
    }


def _call_record(call: LlmCall) -> Record:
    return {
        "request": msgspec.to_builtins(call.request),
        "response": msgspec.to_builtins(call.response),
        "model": call.model,
        "weight_version": call.weight_version,
        "finish_reason": call.finish_reason,
        "request_id": call.request_id,
        "usage": call.usage,
    }


def own_steps(episode: Episode) -> Episode | None:
    """An episode as its text, conversational and messages records read it. With
    model calls and an agent step after its first call (the agent reported what its
    calls' answers did: its reasoning, actions and outputs, through the gateway's
    steps route), its steps without the calls; with calls and no such step, None:
    it reads from its calls (:mod:`.calls`); without calls, as it is."""
    if episode.tokens is None:
        return episode
    kinds = [s.kind for s in episode.steps]
    first = kinds.index("llm_call") if "llm_call" in kinds else len(kinds)
    if not AGENT_KINDS.intersection(kinds[first:]):
        return None
    steps = [s for s in episode.steps if s.kind != "llm_call"]
    return msgspec.structs.replace(episode, steps=steps, tokens=None)


def first_agent_step(spans: list[tuple[int, int]], steps: list[Step]) -> int:
    return spans[0][0] if spans else len(steps)
