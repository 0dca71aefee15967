"""The episode recorder: numbers an episode's steps, stamps and checks each event.

Pure apart from what it is handed: ``EpisodeBuilder`` returns each event, and the
recorders of ``stream_export.client`` pass each one to a producer's ``send``. An
event that a worker would reject raises DecodeError before it takes a sequence
number. Leaving a recorder's block with an exception ends the episode as a
failure; leaving it without ``end()`` ends it with outcome "other".
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Generic, Required, Self, TypedDict, TypeVar, Unpack

import msgspec

from stream_export.contract.calls import CallRequest, CallResponse, LlmCall, text_only
from stream_export.contract.decoding import DEFAULT_MAX_EVENT_BYTES, encode_event, non_finite
from stream_export.contract.events import (
    EpisodeEnd,
    EpisodeStart,
    Evaluator,
    Outcome,
    Prompt,
    Scalar,
    Score,
    Step,
    StepEvent,
    StepKind,
)
from stream_export.contract.reasons import DeadLetterReason
from stream_export.errors import (
    DecodeError,
    KafkaUnavailableError,
    ProduceError,
    RecorderError,
    StreamExportError,
)

log = logging.getLogger(__name__)

#: Metadata as callers pass it (any mapping; stored as a dict).
MetadataIn = Mapping[str, Scalar | list[Scalar]]

R = TypeVar("R")


class EpisodeFields(TypedDict, total=False):
    """What a new episode is about (the start event's fields)."""

    agent_id: Required[str]
    prompt: Required[Prompt]
    #: A fresh UUID when left out.
    episode_id: str | None
    #: Rollouts of the same task share it (a GRPO group).
    group_id: str | None
    #: How many rollouts that group expects (it closes when they all ended).
    group_size: int | None
    metadata: MetadataIn | None


class ScoreFields(TypedDict, total=False):
    """Who scored and what (a score event's fields besides the episode, name and value)."""

    #: Who scored (a judge, a verifier, a person's tool).
    evaluator: Required[str]
    evaluator_version: str | None
    #: Default ``<evaluator>:<episode_id>:<name>``: the same judge scoring the same
    #: name again sends the same score (counted once).
    score_id: str | None
    label: str | None
    #: The model call (its request_id) or step (its seq) scored.
    request_id: str | None
    seq: int | None


def score_event(
    episode_id: str,
    name: str,
    value: float,
    *,
    clock: Callable[[], float] = time.time,
    max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
    **fields: Unpack[ScoreFields],
) -> Score:
    """A checked score event for episode ``episode_id``, stamped now (raises
    DecodeError for what a worker would reject: a non-finite value, a bad name)."""
    if not math.isfinite(value):
        raise non_finite(value)
    evaluator = fields["evaluator"]
    event = Score(
        episode_id=episode_id,
        time=clock(),
        score_id=fields.get("score_id") or f"{evaluator}:{episode_id}:{name}",
        name=name,
        value=value,
        evaluator=Evaluator(id=evaluator, version=fields.get("evaluator_version")),
        label=fields.get("label"),
        request_id=fields.get("request_id"),
        seq=fields.get("seq"),
    )
    encode_event(event, max_bytes=max_event_bytes)
    return event


@dataclass(frozen=True)
class DeltaBase:
    """What a delta needs of the call it continues: the call's seq, how many ids its
    prompt and completion hold, and their digest. The ids themselves are not kept
    (a 32k-token prompt is ~1.3 MB of Python ints, per open episode)."""

    seq: int
    length: int
    digest: bytes

    @classmethod
    def of(cls, seq: int, ids: list[int]) -> DeltaBase:
        return cls(seq, len(ids), _digest(ids))

    def continued_by(self, prompt: list[int]) -> bool:
        """Whether ``prompt`` starts with the base's ids."""
        return len(prompt) >= self.length and _digest(prompt[: self.length]) == self.digest


def _digest(ids: list[int]) -> bytes:
    return hashlib.blake2b(msgspec.json.encode(ids), digest_size=16).digest()


class _Recorder(Generic[R]):
    """One episode's events: numbers steps, stamps times, checks each event, and hands
    it to ``emit``, whose result each method returns (an awaitable for the async
    recorder, None for the sync one, the event itself for the pure EpisodeBuilder).

    An event that a worker would reject raises DecodeError before it takes a
    sequence number, so a bad call never leaves a gap in the episode.
    """

    def __init__(
        self,
        emit: Callable[[StepEvent], R],
        *,
        clock: Callable[[], float] = time.time,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        **fields: Unpack[EpisodeFields],
    ) -> None:
        self._emit = emit
        self.episode_id = fields.get("episode_id") or str(uuid.uuid4())
        self.agent_id = fields["agent_id"]
        self.prompt = fields["prompt"]
        self.group_id = fields.get("group_id")
        self.group_size = fields.get("group_size")
        self.metadata = dict(fields.get("metadata") or {})
        self.clock = clock
        self.max_event_bytes = max_event_bytes
        #: Steps so far (the next step's seq).
        self.steps = 0
        self.started = False
        self.ended = False
        #: What the next call's delta needs of the last llm_call.
        self._last_call: DeltaBase | None = None

    @property
    def last_call(self) -> DeltaBase | None:
        """What the next call's delta needs of the last llm_call (its base)."""
        return self._last_call

    def resume(self, steps: int, last_call: DeltaBase | None) -> None:
        """Continue an episode whose start and first ``steps`` steps were sent before
        (by a process that kept ``steps`` and ``last_call``, e.g. a restarted gateway)."""
        self.started = True
        self.steps = steps
        self._last_call = last_call

    def start(self) -> R:
        if self.started:
            raise RecorderError(f"episode {self.episode_id} is already started")
        event = self._make(
            EpisodeStart,
            agent_id=self.agent_id,
            prompt=self.prompt,
            group_id=self.group_id,
            group_size=self.group_size,
            metadata=self.metadata,
        )
        self.started = True
        return self._emit(event)

    def step(
        self,
        kind: StepKind,
        content: str = "",
        *,
        name: str | None = None,
        arguments: dict[str, Any] | None = None,
        data: Any = None,
        id: str | None = None,
    ) -> R:
        self._require_open()
        event = self._make(
            Step,
            seq=self.steps,
            kind=kind,
            content=content,
            name=name,
            arguments=arguments,
            data=data,
            id=id,
        )
        self.steps += 1
        return self._emit(event)

    def llm_call(
        self,
        request: CallRequest | Mapping[str, Any],
        response: CallResponse | Mapping[str, Any],
        *,
        prompt_token_ids: Sequence[int],
        completion_token_ids: Sequence[int],
        logprobs: Sequence[float],
        model: str,
        weight_version: int | str,
        finish_reason: str,
        request_id: str,
        usage: Mapping[str, Any] | None = None,
        delta: bool = True,
    ) -> R:
        """Record one model call token for token. ``request`` (``messages``, ``tools``)
        and ``response`` (``content``, ``reasoning``, ``tool_calls``) are in OpenAI
        chat shape. With ``delta``, a prompt that continues the previous call's prompt
        and completion is sent as the ids it adds (``prompt_base``: that call's seq);
        the worker puts the whole prompt back together. Empty token arrays record a
        text-only call (a server without token ids): no later call is a delta of it."""
        self._require_open()
        prompt = list(prompt_token_ids)
        completion = list(completion_token_ids)
        sent, base = prompt, None
        last = self._last_call
        if delta and last is not None and last.continued_by(prompt):
            sent, base = prompt[last.length :], last.seq
        try:
            call = LlmCall(
                request=msgspec.convert(request, CallRequest, from_attributes=True),
                response=msgspec.convert(response, CallResponse, from_attributes=True),
                prompt_token_ids=sent,
                completion_token_ids=completion,
                logprobs=list(logprobs),
                model=model,
                weight_version=weight_version,
                finish_reason=finish_reason,
                request_id=request_id,
                usage=None if usage is None else dict(usage),
                prompt_base=base,
            )
        except msgspec.ValidationError as exc:
            raise DecodeError(f"llm_call: {exc}", reason=DeadLetterReason.INVALID) from None
        event = self._make(Step, seq=self.steps, kind="llm_call", call=call)
        if not text_only(call):
            self._last_call = DeltaBase.of(self.steps, prompt + completion)
        self.steps += 1
        return self._emit(event)

    def observation(self, content: str) -> R:
        return self.step("observation", content)

    def thought(self, content: str) -> R:
        return self.step("thought", content)

    def action(
        self,
        content: str,
        *,
        name: str | None = None,
        arguments: dict[str, Any] | None = None,
        id: str | None = None,
    ) -> R:
        """An action; ``id`` is its tool call id (OpenAI's), if it has one."""
        return self.step("action", content, name=name, arguments=arguments, id=id)

    def result(
        self, content: str, *, name: str | None = None, data: Any = None, id: str | None = None
    ) -> R:
        """An action's result; ``id`` is the tool call id it answers."""
        return self.step("action_result", content, name=name, data=data, id=id)

    def output(self, content: str) -> R:
        return self.step("output", content)

    def message(self, content: str) -> R:
        return self.step("message", content)

    def end(
        self, outcome: Outcome, *, reward: float | None = None, metadata: MetadataIn | None = None
    ) -> R:
        self._require_open()
        event = self._make(
            EpisodeEnd,
            steps=self.steps,
            outcome=outcome,
            reward=reward,
            metadata=dict(metadata or {}),
        )
        self.ended = True
        return self._emit(event)

    def score(self, name: str, value: float, **fields: Unpack[ScoreFields]) -> R:
        """Score this episode (also after ``end()``): a named reward component from
        ``evaluator``; see :func:`score_event`."""
        if not self.started:
            raise RecorderError(f"episode {self.episode_id} is not started yet")
        event = score_event(
            self.episode_id,
            name,
            value,
            clock=self.clock,
            max_event_bytes=self.max_event_bytes,
            **fields,
        )
        return self._emit(event)

    def _require_open(self) -> None:
        if not self.started:
            raise RecorderError(f"episode {self.episode_id} is not started yet")
        if self.ended:
            raise RecorderError(f"episode {self.episode_id} has already ended")

    def _make(self, event_type: Callable[..., StepEvent], **fields: Any) -> StepEvent:
        """This episode's next event, stamped now and checked."""
        event = event_type(episode_id=self.episode_id, time=self.clock(), **fields)
        encode_event(event, max_bytes=self.max_event_bytes)
        return event

    def _closing(self, exc: BaseException | None) -> R | None:
        """End the episode when its block exits without ``end()`` (if it still can)."""
        if self.ended or not self.started:
            return None
        if isinstance(exc, (KafkaUnavailableError, ProduceError)):
            return None  # the producer itself failed; another send would only wait again
        if exc is None:
            return self.end("other")
        return self.end("failure", metadata={"error": f"{type(exc).__name__}: {exc}"[:1000]})

    def _closing_failed(self, exc: BaseException | None, error: StreamExportError) -> None:
        if exc is None:
            raise error
        log.warning("could not end episode %s after %r: %s", self.episode_id, exc, error)


class EpisodeBuilder(_Recorder[StepEvent]):
    """The recorder without I/O: each method returns the event it made (pure, for
    tests, simulations and replays)."""

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES,
        **fields: Unpack[EpisodeFields],
    ) -> None:
        super().__init__(_same, clock=clock, max_event_bytes=max_event_bytes, **fields)


def _same(event: StepEvent) -> StepEvent:
    return event


class EpisodeRecorder(_Recorder[Awaitable[None]]):
    """Records one episode through a Producer (every method is awaited)."""

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            ending = self._closing(exc)
            if ending is not None:
                await ending
        except StreamExportError as error:
            self._closing_failed(exc, error)


class SyncEpisodeRecorder(_Recorder[None]):
    """Records one episode through a SyncProducer."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, t: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self._closing(exc)
        except StreamExportError as error:
            self._closing_failed(exc, error)
