"""The gateway's open episodes and the step events each call makes (no I/O).

Each open episode is an ``EpisodeBuilder`` (the client's recorder: it numbers the
steps and sends a call's prompt ids as a delta against the previous call), the
tool calls its answers made that no tool message has answered yet, and its
outbox: encoded events Kafka has not acknowledged yet, sent again (identical,
so the worker drops the copies) before the episode's next event. ``state`` and
``restore`` are what the write-ahead log keeps of an episode: a few hundred
bytes (the previous call is kept as a digest, the start's prompt not at all, its
group for whole-group admission) besides the events not acknowledged yet.

The ``Book`` holds them all: the open episodes by id, the number each client key
holds (``gateway.max_open_episodes`` and ``max_open_episodes_per_key`` bound
them), and what it remembers of the episodes it closed, so a retried end
answers as the first did and a call of a closed episode answers 409.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from stream_export.client.recorder import DeltaBase, EpisodeBuilder
from stream_export.contract.calls import CallMessage, CallRequest
from stream_export.contract.events import StepEvent
from stream_export.errors import DecodeError
from stream_export.gateway.mapping import Sampled

#: Unanswered tool calls an episode remembers (the oldest are forgotten first).
MAX_PENDING_TOOLS = 1024


@dataclass(frozen=True)
class LastBatch:
    """An episode's last batch of agent steps (``stream_export.gateway.steps``): its
    number, the digest of its request and the answer a repeat gets."""

    number: int
    digest: str
    answer: dict[str, Any]


@dataclass
class OpenEpisode:
    builder: EpisodeBuilder
    #: Tool call id -> tool name, for calls the episode's answers made that no
    #: tool message has answered yet.
    tools: dict[str, str] = field(default_factory=dict)
    #: Encoded events not acknowledged by Kafka yet, in order.
    outbox: list[bytes] = field(default_factory=list)
    #: How many of ``outbox`` the write-ahead log holds.
    logged: int = 0
    #: Who started it: a digest of its client key (``access.fingerprint``; "" with
    #: client keys off), the key its calls and its end need, and the key its
    #: gateway.max_open_episodes_per_key counts against.
    client: str = ""
    #: When it was last active (time.time(): started, called, restored).
    active_at: float = 0.0
    #: Calls under way (an episode is never expired with one).
    calls: int = 0
    #: The next batch of agent steps expected (0, 1, ...), and the last one.
    batches: int = 0
    last_batch: LastBatch | None = None
    #: Calls of one episode are recorded one at a time, in the order they finish.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def episode_id(self) -> str:
        return self.builder.episode_id

    @property
    def ended(self) -> bool:
        return self.builder.ended

    def outbox_bytes(self) -> int:
        return sum(map(len, self.outbox))

    @contextlib.contextmanager
    def calling(self) -> Iterator[None]:
        """One call under way: the episode is active, and not expired meanwhile."""
        self.calls += 1
        self.active_at = time.time()
        try:
            yield
        finally:
            self.calls -= 1
            self.active_at = time.time()

    def state(self) -> dict[str, Any]:
        """What the write-ahead log keeps of this episode besides its outbox (JSON-ready)."""
        base = self.builder.last_call
        return {
            "agent_id": self.builder.agent_id,
            "group": [self.builder.group_id, self.builder.group_size],
            "steps": self.builder.steps,
            "ended": self.builder.ended,
            "base": None if base is None else [base.seq, base.length, base.digest.hex()],
            "tools": self.tools,
            "client": self.client,
            "at": self.active_at,
            "batches": self.batches,
            "last_batch": None if self.last_batch is None else dataclasses.asdict(self.last_batch),
        }

    @classmethod
    def restore(
        cls, episode_id: str, state: dict[str, Any], outbox: list[bytes], max_event_bytes: int
    ) -> OpenEpisode:
        """The episode as ``state()`` left it; its start was sent before, so the
        builder only needs what numbers and bases the next steps."""
        group_id, group_size = state.get("group") or (None, None)
        builder = EpisodeBuilder(
            episode_id=episode_id,
            agent_id=state["agent_id"],
            prompt="",
            group_id=group_id,
            group_size=group_size,
            max_event_bytes=max_event_bytes,
        )
        base = state["base"]
        builder.resume(
            state["steps"],
            None if base is None else DeltaBase(base[0], base[1], bytes.fromhex(base[2])),
        )
        builder.ended = state["ended"]
        last = state.get("last_batch")
        return cls(
            builder,
            tools=dict(state["tools"]),
            outbox=outbox,
            logged=len(outbox),
            client=state["client"],
            active_at=state["at"],
            batches=state.get("batches", 0),
            last_batch=None if last is None else LastBatch(**last),
        )


@dataclass(frozen=True)
class Closed:
    """What the gateway remembers of an episode it closed: how many steps it had,
    when (time.time()), whether it expired (idle) rather than ended, and who
    started it (``OpenEpisode.client``)."""

    steps: int
    at: float
    expired: bool = False
    client: str = ""


class Book:
    """The open episodes by id, how many each client holds, and the closed ones
    remembered (at most ``max_open`` of them, the oldest forgotten first)."""

    def __init__(self, max_open: int, max_open_per_key: int) -> None:
        self.max_open = max_open
        self.max_open_per_key = max_open_per_key
        self.episodes: dict[str, OpenEpisode] = {}
        self.closed: dict[str, Closed] = {}
        self.per_client: Counter[str] = Counter()

    def full(self, client: str) -> str | None:
        """Why one more episode of ``client`` is refused (its reason), or None; the
        cap per key applies to client keys only ("": keys off)."""
        if len(self.episodes) >= self.max_open:
            return "too_many_episodes"
        if client and self.per_client[client] >= self.max_open_per_key:
            return "too_many_episodes_for_key"
        return None

    def add(self, episode: OpenEpisode) -> None:
        self.episodes[episode.episode_id] = episode
        self.per_client[episode.client] += 1

    def close(self, episode: OpenEpisode, closed: Closed) -> list[str]:
        """Forget an open episode, remember it closed; the ids of the closed episodes
        no longer remembered to make room."""
        if self.episodes.pop(episode.episode_id, None) is not None:
            self.per_client[episode.client] -= 1
            if not self.per_client[episode.client]:
                del self.per_client[episode.client]
        self.closed[episode.episode_id] = closed
        return self.forget(len(self.closed) - self.max_open)

    def idle(self, before: float) -> list[OpenEpisode]:
        """The episodes last active before ``before`` with no call under way and
        nothing waiting for Kafka (an outbox is never dropped)."""
        return [
            e
            for e in self.episodes.values()
            if e.active_at < before and not e.calls and not e.outbox and not e.lock.locked()
        ]

    def forget(self, count: int = 0, before: float | None = None) -> list[str]:
        """Stop remembering the ``count`` oldest closed episodes and those closed
        before ``before``; their ids."""
        gone: list[str] = []
        for key, closed in self.closed.items():
            if len(gone) >= count and (before is None or closed.at >= before):
                break
            gone.append(key)
        for key in gone:
            del self.closed[key]
        return gone


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
