"""The wire contract: step events (steps topic) and finished episodes (episodes topic).

Step events are a msgspec tagged union on ``type`` ("start", "step", "end"); every
message carries its schema major version in ``v``. Unknown fields are ignored so
producers can add fields without breaking older workers; an unknown ``type`` or a
newer major version is rejected. The Kafka key of every message is episode_id.

Times are float seconds since the Unix epoch (event time, set by the agent).
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

from stream_export.errors import DecodeError

SCHEMA_VERSION: Final = 1

StepKind = Literal["observation", "thought", "action", "action_result", "output", "message"]
Outcome = Literal["success", "failure", "other"]
Role = Literal["system", "user", "assistant", "tool"]
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
Seq = Annotated[int, msgspec.Meta(ge=0)]
#: Metadata values: scalars or lists of scalars (tags). Keys are free-form.
Scalar = str | int | float | bool | None
Metadata = dict[str, Scalar | list[Scalar]]


class ChatMessage(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True):
    role: Role
    content: str
    name: str | None = None


Prompt = str | list[ChatMessage]


class _Event(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True):
    episode_id: Id
    time: float
    v: int = SCHEMA_VERSION


class EpisodeStart(_Event, tag="start"):
    """Opens an episode: the prompt/observation the agent starts from."""

    agent_id: Id
    prompt: Prompt
    #: Rollouts of the same task share a group id (GRPO groups).
    group_id: str | None = None
    metadata: Metadata = {}


class Step(_Event, tag="step"):
    """One step of an episode, numbered 0, 1, 2, ... by ``seq``."""

    seq: Seq
    kind: StepKind
    content: str = ""
    #: For actions and action results: the tool/action name, its arguments, and
    #: structured result data.
    name: str | None = None
    arguments: dict[str, Any] | None = None
    data: Any = None


class EpisodeEnd(_Event, tag="end"):
    """Closes an episode; ``steps`` is how many Step events it has in total."""

    steps: Seq
    outcome: Outcome
    reward: float | None = None
    metadata: Metadata = {}


StepEvent = EpisodeStart | Step | EpisodeEnd


class SourceOffset(msgspec.Struct, array_like=True):
    """Where an event came from: steps-topic partition and offset."""

    partition: int
    offset: int


class Episode(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A finished episode as published on the episodes topic.

    ``episode_id`` is its stable identity: a re-emission after a crash carries the
    same id, so sinks drop the repeat.
    """

    episode_id: str
    agent_id: str
    prompt: Prompt
    steps: list[Step]
    start_time: float
    end_time: float
    outcome: Outcome
    group_id: str | None = None
    reward: float | None = None
    #: Start metadata updated with end metadata (end wins on the same key).
    metadata: Metadata = {}
    truncated: bool = False
    truncated_reason: str | None = None
    #: Steps-topic offsets the episode was built from (for lineage / audits).
    sources: list[SourceOffset] = []
    v: int = SCHEMA_VERSION

    @property
    def duration(self) -> float:
        return max(0.0, self.end_time - self.start_time)


class _Envelope(msgspec.Struct):
    """Just enough of a message to explain why the full decode failed."""

    type: Any = None
    v: Any = None


_step_decoder: Final = msgspec.json.Decoder(StepEvent)
_envelope_decoder: Final = msgspec.json.Decoder(_Envelope)
_episode_decoder: Final = msgspec.json.Decoder(Episode)
_encoder: Final = msgspec.json.Encoder()
_KNOWN_TYPES: Final = frozenset({"start", "step", "end"})
DEFAULT_MAX_EVENT_BYTES: Final = 1_048_576


def decode_event(data: bytes, *, max_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> StepEvent:
    """Decode one steps-topic message, or raise DecodeError saying why not."""
    if len(data) > max_bytes:
        raise DecodeError(f"message is {len(data)} bytes, limit is {max_bytes}", reason="too_large")
    try:
        event = _step_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _explain(data, exc) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(f"not valid JSON: {exc}", reason="not_json") from None
    if event.v > SCHEMA_VERSION:
        raise DecodeError(
            f"schema version {event.v} is newer than supported {SCHEMA_VERSION}",
            reason="unsupported_version",
        )
    return event


def _explain(data: bytes, exc: msgspec.ValidationError) -> DecodeError:
    try:
        env = _envelope_decoder.decode(data)
    except msgspec.MsgspecError:
        return DecodeError(f"not an event object: {exc}", reason="invalid")
    if isinstance(env.v, int) and not isinstance(env.v, bool) and env.v > SCHEMA_VERSION:
        return DecodeError(
            f"schema version {env.v} is newer than supported {SCHEMA_VERSION}",
            reason="unsupported_version",
        )
    if env.type not in _KNOWN_TYPES:
        return DecodeError(
            f"unknown event type {env.type!r}; expected one of start, step, end",
            reason="unknown_type",
        )
    return DecodeError(str(exc), reason="invalid")


def encode(obj: StepEvent | Episode) -> bytes:
    return _encoder.encode(obj)


def decode_episode(data: bytes) -> Episode:
    try:
        return _episode_decoder.decode(data)
    except msgspec.MsgspecError as exc:
        raise DecodeError(f"not a valid episode: {exc}", reason="invalid") from None
