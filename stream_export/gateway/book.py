"""The gateway's open episodes and the step events each call makes (no I/O).

Each open episode is an ``EpisodeBuilder`` (the client's recorder: it numbers the
steps and sends a call's prompt ids as a delta against the previous call), the
tool calls its answers made that no tool message has answered yet, and its
outbox: encoded events Kafka has not acknowledged yet, sent again (identical,
so the worker drops the copies) before the episode's next event. ``state`` and
``restore`` are what the write-ahead log keeps of an episode.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from stream_export.calls import CallMessage, CallRequest
from stream_export.client.recorder import EpisodeBuilder
from stream_export.errors import DecodeError
from stream_export.events import StepEvent
from stream_export.gateway.mapping import Sampled

#: Unanswered tool calls an episode remembers (the oldest are forgotten first).
MAX_PENDING_TOOLS = 1024


@dataclass
class OpenEpisode:
    builder: EpisodeBuilder
    #: Tool call id -> tool name, for calls the episode's answers made that no
    #: tool message has answered yet.
    tools: dict[str, str] = field(default_factory=dict)
    #: Encoded events not acknowledged by Kafka yet, in order.
    outbox: list[bytes] = field(default_factory=list)
    #: Calls of one episode are recorded one at a time, in the order they finish.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: Who started it: a digest of its client key (``access.fingerprint``; "" with
    #: client keys off), the key its calls and its end need.
    client: str = ""

    @property
    def episode_id(self) -> str:
        return self.builder.episode_id

    @property
    def ended(self) -> bool:
        return self.builder.ended

    def outbox_bytes(self) -> int:
        return sum(map(len, self.outbox))

    def state(self) -> dict[str, Any]:
        """What the write-ahead log keeps of this episode (JSON-ready)."""
        last = self.builder.last_call
        return {
            "id": self.episode_id,
            "agent_id": self.builder.agent_id,
            "steps": self.builder.steps,
            "ended": self.builder.ended,
            "last_call": None if last is None else [last[0], last[1]],
            "tools": self.tools,
            "outbox": [event.decode() for event in self.outbox],
            "client": self.client,
        }

    @classmethod
    def restore(cls, state: dict[str, Any], max_event_bytes: int) -> OpenEpisode:
        """The episode as ``state()`` left it; its start was sent before, so the
        builder only needs what numbers and bases the next steps."""
        builder = EpisodeBuilder(
            episode_id=state["id"],
            agent_id=state["agent_id"],
            prompt="",
            max_event_bytes=max_event_bytes,
        )
        last = state["last_call"]
        builder.resume(state["steps"], None if last is None else (last[0], list(last[1])))
        builder.ended = state["ended"]
        return cls(
            builder,
            tools=dict(state["tools"]),
            outbox=[event.encode() for event in state["outbox"]],
            client=state.get("client", ""),
        )


@dataclass
class CallEvents:
    """The events one call makes: its tool results, then its ``llm_call`` step;
    ``error`` when the call itself cannot be recorded (its tool results still are)."""

    events: list[StepEvent]
    error: DecodeError | None = None


def call_events(
    episode: OpenEpisode, request: CallRequest, sampled: Sampled, weight_version: int | str
) -> CallEvents:
    """The tool messages of ``request`` that answer the episode's earlier tool calls
    become ``action_result`` steps (each once, with its ``tool_call_id``), then the
    call becomes one ``llm_call`` step, its prompt a delta when it continues the
    episode's previous call."""
    builder = episode.builder
    events: list[StepEvent] = []
    for message in request.messages:
        if message.role == "tool" and message.tool_call_id in episode.tools:
            name = episode.tools.pop(message.tool_call_id)
            events.append(builder.result(_text(message), name=name, id=message.tool_call_id))
    try:
        events.append(
            builder.llm_call(
                request,
                sampled.response,
                prompt_token_ids=sampled.prompt_token_ids,
                completion_token_ids=sampled.completion_token_ids,
                logprobs=sampled.logprobs,
                model=sampled.model,
                weight_version=weight_version,
                finish_reason=sampled.finish_reason,
                request_id=sampled.request_id,
                usage=sampled.usage,
            )
        )
    except DecodeError as exc:
        return CallEvents(events, exc)
    for call in sampled.response.tool_calls or []:
        episode.tools[call.id] = call.function.name
    while len(episode.tools) > MAX_PENDING_TOOLS:
        del episode.tools[next(iter(episode.tools))]
    return CallEvents(events)


def _text(message: CallMessage) -> str:
    """A tool message's content as text (the text parts of a content-part list)."""
    content = message.content
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
