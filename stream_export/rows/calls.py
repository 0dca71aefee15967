"""An episode with model calls read as a conversation: the text and conversational
records of its calls (pure, no I/O).

The text and conversational formats of an episode with calls are derived from
the calls, not from its other steps: the conversation is the first call's
request messages, then per call its response as an assistant message and the
messages the next call's request adds after its last assistant message (tool
results, user turns). Per decision (``granularity = "step"``) each call is one
record: its request messages, and its response. Messages carry OpenAI
``tool_calls`` and ``tool_call_id``; the record's ``tools`` column is the JSON
text of the tool definitions of its first call's request (``"null"`` without).
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from stream_export.contract.calls import CallMessage, CallResponse, LlmCall, ToolCall
from stream_export.contract.episode import Episode
from stream_export.rows.episode import Record

_SEP: Final = "\n\n"
_encoder: Final = msgspec.json.Encoder()


def calls(episode: Episode) -> list[LlmCall]:
    """The episode's model calls, in seq order (none for a text-plane episode)."""
    return [step.call for step in episode.steps if step.call is not None]


def _content(content: str | list[dict[str, Any]] | None) -> str:
    """Message content as text: content parts' texts joined (others left out)."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")


def _tool_calls(calls: list[ToolCall] | None) -> list[Record] | None:
    if not calls:
        return None
    return [
        {
            "id": c.id,
            "type": c.type,
            "function": {"name": c.function.name, "arguments": c.function.arguments},
        }
        for c in calls
    ]


def _message(message: CallMessage) -> Record:
    return {
        "role": message.role,
        "content": _content(message.content),
        "name": message.name,
        "tool_calls": _tool_calls(message.tool_calls),
        "tool_call_id": message.tool_call_id,
    }


def _answer(response: CallResponse) -> Record:
    return {
        "role": "assistant",
        "content": response.content or "",
        "name": None,
        "tool_calls": _tool_calls(response.tool_calls),
        "tool_call_id": None,
    }


def _added(call: LlmCall) -> list[CallMessage]:
    """What a call's request adds after its last assistant message (all of it when
    there is none: a fresh conversation)."""
    messages = call.request.messages
    last = max((i for i, m in enumerate(messages) if m.role == "assistant"), default=-1)
    return messages[last + 1 :]


def _tools(call: LlmCall) -> str:
    return _encoder.encode(call.request.tools).decode()


def conversation_records(episode: Episode, per_step: bool) -> list[Record]:
    """Conversational records of an episode with calls (see the module doc)."""
    made = calls(episode)
    if not made:
        return []
    if per_step:
        return [
            {
                "prompt": [_message(m) for m in c.request.messages],
                "completion": [_answer(c.response)],
                "tools": _tools(c),
            }
            for c in made
        ]
    completion = []
    for i, call in enumerate(made):
        completion.append(_answer(call.response))
        if i + 1 < len(made):
            completion += [_message(m) for m in _added(made[i + 1])]
    prompt = [_message(m) for m in made[0].request.messages]
    return [{"prompt": prompt, "completion": completion, "tools": _tools(made[0])}]


def _text(message: Record, reasoning: str | None = None) -> str:
    parts = [reasoning or "", message["content"]]
    for c in message["tool_calls"] or ():
        parts.append(f"Action: {c['function']['name']}({c['function']['arguments']})")
    return _SEP.join(p for p in parts if p)


def text_records(episode: Episode, per_step: bool, separator: str) -> list[Record]:
    """Text records of an episode with calls: the conversational records' messages
    as paragraphs (an answer's reasoning first, its tool calls as ``Action:``
    lines, as the text format writes actions)."""
    made = calls(episode)
    records = conversation_records(episode, per_step)
    answers = iter(c.response.reasoning for c in made)
    out = []
    for record in records:
        prompt = _SEP.join(t for t in map(_text, record["prompt"]) if t)
        texts = [
            _text(m, next(answers) if m["role"] == "assistant" else None)
            for m in record["completion"]
        ]
        completion = _SEP.join(t for t in texts if t)
        if completion:
            out.append({"prompt": prompt, "completion": separator + completion})
    return out
