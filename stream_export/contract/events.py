"""The wire contract: step events (steps topic) and finished episodes (episodes topic).

Step events are a msgspec tagged union on ``type`` ("start", "step", "end", and
"score": a reward from a judge, verifier or person, possibly after the end); every
message carries its schema major version in ``v``. Unknown fields are ignored so
producers can add fields without breaking older workers; an unknown ``type`` or a
newer major version is rejected. The Kafka key of every message is episode_id.

Times are float seconds since the Unix epoch (event time, set by the agent).

The JSON Schemas in ``topics/schemas/`` are generated from these types
(``stream-export topics schemas``); a unit test fails when they drift.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec

from stream_export.contract import widths
from stream_export.contract.calls import LlmCall, Tokens
from stream_export.contract.reasons import DeadLetterReason
from stream_export.errors import DecodeError

T = TypeVar("T")

SCHEMA_VERSION: Final = 1

StepKind = Literal[
    "observation", "thought", "action", "action_result", "output", "message", "llm_call"
]
Outcome = Literal["success", "failure", "other"]
Role = Literal["system", "user", "assistant", "tool"]
#: Longest episode or group id (characters): ids are Kafka keys and state keys.
MAX_ID_LENGTH: Final = 512
Id = Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_ID_LENGTH)]
Seq = widths.Index
#: Largest group_size accepted (the groups.default_size setting has the same bound).
MAX_GROUP_SIZE: Final = 100_000
GroupSize = Annotated[int, msgspec.Meta(ge=1, le=MAX_GROUP_SIZE)]
#: Metadata values: scalars or lists of scalars (tags). Keys are free-form.
Scalar = str | int | float | bool | None
Metadata = dict[str, Scalar | list[Scalar]]


class ChatMessage(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True):
    role: Role
    content: str
    name: str | None = None


Prompt = str | list[ChatMessage]


def _current_version() -> int:
    # A default_factory (unlike a plain default) is never omitted by omit_defaults,
    # so every encoded event carries its version while decoding still accepts
    # producers that leave it out.
    return SCHEMA_VERSION


# gc=False: events are plain trees decoded from JSON (no reference cycles), and
# skipping GC tracking makes decoding measurably faster on the hot path.
class _Event(msgspec.Struct, tag_field="type", kw_only=True, omit_defaults=True, gc=False):
    # The upper bound makes msgspec itself reject newer versions, so the happy path
    # needs no check of its own; _explain turns that failure into unsupported_version.
    v: Annotated[
        int,
        msgspec.Meta(
            ge=1,
            le=SCHEMA_VERSION,
            description="Schema major version; a worker rejects versions newer than its own.",
        ),
    ] = msgspec.field(default_factory=_current_version)
    episode_id: Annotated[Id, msgspec.Meta(description="Also the Kafka message key (UTF-8).")]
    time: Annotated[float, msgspec.Meta(description="Event time, seconds since the Unix epoch.")]


class EpisodeStart(_Event, tag="start", kw_only=True, gc=False):
    """Opens an episode: the prompt/observation the agent starts from."""

    agent_id: Id
    prompt: Annotated[
        Prompt, msgspec.Meta(description="Plain text, or chat messages with role and content.")
    ]
    #: Rollouts of the same task share a group id (GRPO groups).
    group_id: Annotated[
        Annotated[str, msgspec.Meta(max_length=MAX_ID_LENGTH)] | None,
        msgspec.Meta(
            description="Rollouts of one task share it (a GRPO group); 512 chars at most."
        ),
    ] = None
    group_size: Annotated[
        GroupSize | None,
        msgspec.Meta(description="How many rollouts the group expects (closes it when reached)."),
    ] = None
    metadata: Annotated[
        Metadata, msgspec.Meta(description="difficulty, domain, tags, free-form scalars.")
    ] = {}


class Step(_Event, tag="step", kw_only=True, gc=False):
    """One step of an episode, numbered 0, 1, 2, ... by ``seq``."""

    seq: Annotated[Seq, msgspec.Meta(description="0, 1, 2, ... within the episode.")]
    kind: StepKind
    content: str = ""
    #: For actions and action results: the tool/action name, its arguments, and
    #: structured result data.
    name: Annotated[str | None, msgspec.Meta(description="Tool/action name.")] = None
    arguments: Annotated[
        dict[str, Any] | None, msgspec.Meta(description="An action's arguments.")
    ] = None
    data: Annotated[Any, msgspec.Meta(description="An action result's structured data.")] = None
    id: Annotated[
        str | None,
        msgspec.Meta(description="An action's or action result's tool call id (OpenAI's)."),
    ] = None
    call: Annotated[
        LlmCall | None, msgspec.Meta(description="The model call of an llm_call step (only).")
    ] = None


class EpisodeEnd(_Event, tag="end", kw_only=True, gc=False):
    """Closes an episode; ``steps`` is how many Step events it has in total."""

    steps: Annotated[
        Seq, msgspec.Meta(description="Total Step events, so the worker knows when all arrived.")
    ]
    outcome: Outcome
    reward: float | None = None
    metadata: Metadata = {}


#: Score names are identifiers, so ``scores.reward`` can name them in an expression
#: (where ``end_reward`` is the end event's reward).
ScoreName = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^(?!end_reward$)[A-Za-z_][A-Za-z0-9_]{0,63}$",
        description="1-64 letters, digits or '_', not starting with a digit; not end_reward.",
    ),
]
#: Largest score event (bytes): a score is a number with a short label, never a payload.
MAX_SCORE_BYTES: Final = 64 * 1024


class Evaluator(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True, gc=False):
    """Who scored: a judge model, a verifier, a person's tool, and its version."""

    id: Id
    version: Annotated[str, msgspec.Meta(max_length=MAX_ID_LENGTH)] | None = None


class Score(_Event, tag="score", kw_only=True, gc=False):
    """A named reward component for an episode, possibly sent after its end.

    ``score_id`` makes it idempotent: the same score again counts once, another
    value under the same id is a conflict."""

    score_id: Annotated[Id, msgspec.Meta(description="Idempotency key of this score.")]
    name: ScoreName
    value: Annotated[float, msgspec.Meta(description="A finite number.")]
    evaluator: Evaluator
    label: Annotated[
        str | None, msgspec.Meta(description="A category or short rationale (optional).")
    ] = None
    request_id: Annotated[
        str | None, msgspec.Meta(description="The model call scored (an llm_call's request_id).")
    ] = None
    seq: Annotated[Seq | None, msgspec.Meta(description="The step scored.")] = None


StepEvent = EpisodeStart | Step | EpisodeEnd | Score


class RecordEvaluator(Evaluator, omit_defaults=False, gc=False):
    """An evaluator as a record carries it: ``version`` null when unset. (The score
    event keeps omitting it: its digest, stored in closed markers, stays the same.)"""


class ScoreRecord(msgspec.Struct, kw_only=True, omit_defaults=False):
    """A score as an episode record carries it (the event without its envelope):
    every field, ``label``, ``request_id`` and ``seq`` null when unset."""

    score_id: str
    name: str
    value: float
    evaluator: RecordEvaluator
    time: float
    label: str | None = None
    request_id: str | None = None
    seq: Seq | None = None


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
    #: The start event's group_size (rollouts the group expects).
    group_size: GroupSize | None = None
    reward: float | None = None
    #: Start metadata updated with end metadata (end wins on the same key).
    metadata: Metadata = {}
    truncated: bool = False
    truncated_reason: str | None = None
    #: Steps-topic offsets the episode was built from (for lineage / audits).
    sources: list[SourceOffset] = []
    #: The llm_call steps as token segments (None without llm_call steps); in
    #: ``steps`` those calls keep everything but their token arrays, which are
    #: emptied (their tokens are here).
    tokens: Tokens | None = None
    #: The scores the episode had when it was published: by name (the last
    #: arrived of a name), each with its evaluator, and the names of
    #: ``scores.required`` it was published without (their hold timed out).
    rewards: dict[str, float] = {}
    scores: list[ScoreRecord] = []
    scores_missing: list[str] = []
    v: int = SCHEMA_VERSION

    @property
    def duration(self) -> float:
        return max(0.0, self.end_time - self.start_time)


class _Envelope(msgspec.Struct):
    """Just enough of a message to explain why the full decode failed."""

    type: Any = None
    v: Any = None
    kind: Any = None


_step_decoder: Final = msgspec.json.Decoder(StepEvent)
_envelope_decoder: Final = msgspec.json.Decoder(_Envelope)
_episode_decoder: Final = msgspec.json.Decoder(Episode)
_encoder: Final = msgspec.json.Encoder()
_KNOWN_TYPES: Final = ("start", "step", "end", "score")
_NON_FINITE: Final = (
    "Number out of range - at `$.value`",
    "Expected `float`, got `null` - at `$.value`",
)
DEFAULT_MAX_EVENT_BYTES: Final = 1_048_576
#: Deepest nesting of objects and arrays accepted in a step's free-form ``data`` and
#: ``arguments`` (a value that is itself an object or array is level 1). Deeper
#: input is rejected as ``too_deep``: it would exhaust the recursion limit of
#: whatever later encodes, formats or loads it, and no agent needs it.
MAX_DEPTH: Final = 64
_NESTED: Final = frozenset({dict, list})


def decode_event(data: bytes | None, *, max_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> StepEvent:
    """Decode one steps-topic message, or raise DecodeError saying what is wrong and where.

    ``data`` is None for a Kafka message without a value (a tombstone).
    """
    # The happy path is two cheap checks, one msgspec decode and, for a step whose
    # data or arguments nest, a depth walk; explaining a failure happens only after.
    if not data:
        raise DecodeError(
            "message is empty; expected a JSON event", reason=DeadLetterReason.NOT_JSON
        )
    if len(data) > max_bytes:
        raise DecodeError(
            f"message is {len(data)} bytes, limit is {max_bytes}", reason=_too_large(data)
        )
    try:
        event = _step_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise _explain(data, exc) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(f"not valid JSON: {exc}", reason=DeadLetterReason.NOT_JSON) from None
    except RecursionError:
        # msgspec nests as deep as Python's recursion limit allows (anywhere in
        # the message, unknown fields included), then gives up with this.
        raise _too_deep("$") from None
    if type(event) is Step:  # only a step's data, arguments and call are free-form
        if event.data is not None or event.call is not None:
            _check_depth(event, "$")
        elif event.arguments:
            for value in event.arguments.values():  # mostly flat: one cheap pass
                if type(value) in _NESTED:
                    _check_depth(event, "$")
                    break
        if event.call is not None or event.kind == "llm_call":
            _check_call(event)
    elif type(event) is Score:
        _check_score(event, len(data))
    return event


def _check_score(score: Score, size: int) -> None:
    if size > MAX_SCORE_BYTES:
        raise DecodeError(
            f"score event is {size} bytes, limit is {MAX_SCORE_BYTES}",
            reason=DeadLetterReason.SCORE_TOO_LARGE,
        )


def non_finite(value: float) -> DecodeError:
    return DecodeError(
        f"score value {value} is not a finite number - at `$.value`",
        reason=DeadLetterReason.NON_FINITE,
    )


def _too_large(data: bytes) -> DeadLetterReason:
    """``call_too_large`` for an llm_call step, else ``too_large`` (the decoder
    skips everything but three top-level fields)."""
    try:
        env = _envelope_decoder.decode(data)
    except (msgspec.MsgspecError, RecursionError):
        return DeadLetterReason.TOO_LARGE
    if env.type == "step" and env.kind == "llm_call":
        return DeadLetterReason.CALL_TOO_LARGE
    if env.type == "score":
        return DeadLetterReason.SCORE_TOO_LARGE
    return DeadLetterReason.TOO_LARGE


def _check_call(step: Step) -> None:
    call = step.call
    if call is None:
        raise DecodeError(
            "step event: an llm_call step needs `call` - at `$.call`",
            reason=DeadLetterReason.INVALID,
        )
    if step.kind != "llm_call":
        raise DecodeError(
            f"step event: `call` is only for kind llm_call, not {step.kind} - at `$.call`",
            reason=DeadLetterReason.INVALID,
        )
    if len(call.logprobs) != len(call.completion_token_ids):
        raise DecodeError(
            f"{len(call.logprobs)} logprobs for {len(call.completion_token_ids)} completion "
            "tokens; expected one per token - at `$.call.logprobs`",
            reason=DeadLetterReason.TOKEN_LENGTH_MISMATCH,
        )
    if call.prompt_base is not None and call.prompt_base >= step.seq:
        raise DecodeError(
            f"step event: prompt_base {call.prompt_base} is not an earlier step than seq "
            f"{step.seq} - at `$.call.prompt_base`",
            reason=DeadLetterReason.INVALID,
        )


def _too_deep(where: str) -> DecodeError:
    return DecodeError(
        f"objects and arrays nest deeper than {MAX_DEPTH} levels - at `{where}`",
        reason=DeadLetterReason.TOO_DEEP,
    )


def _check_depth(step: Step, where: str) -> None:
    values: list[tuple[str, Any]] = [("data", step.data), ("arguments", step.arguments)]
    call = step.call
    if call is not None:
        values += [("call.usage", call.usage), ("call.request.tools", call.request.tools)]
        values += [
            (f"call.request.messages[{i}].content", m.content)
            for i, m in enumerate(call.request.messages)
        ]
    for name, value in values:
        if type(value) in _NESTED and deeper_than(value, MAX_DEPTH):
            raise _too_deep(f"{where}.{name}")


def deeper_than(value: dict[str, Any] | list[Any], limit: int) -> bool:
    """Whether ``value`` nests dicts and lists more than ``limit`` levels, one level
    at a time (no recursion; msgspec decodes JSON into exactly dict and list)."""
    level: list[Any] = [value]
    depth = 1
    while True:
        nested = [
            child
            for item in level
            for child in (item.values() if type(item) is dict else item)
            if type(child) in _NESTED
        ]
        if not nested:
            return False
        depth += 1
        if depth > limit:
            return True
        level = nested


def decode_as(decoder: msgspec.json.Decoder[T], data: bytes | None, what: str) -> T:
    """``data`` decoded by ``decoder``, or DecodeError ``invalid`` naming ``what``:
    the one step of every worker-written message's decoding (group records, score
    rows, verdicts)."""
    try:
        return decoder.decode(data or b"")
    except msgspec.MsgspecError as exc:
        raise DecodeError(f"not a {what}: {exc}", reason=_invalid(exc)) from None


_BOUND: Final = re.compile(r"Expected `(?:int|float)` [<>]= (\S+) - at ")


def _invalid(exc: msgspec.MsgspecError) -> DeadLetterReason:
    """``out_of_range`` for a number its declared type cannot hold (over a width's
    bound, or beyond float64 altogether), else ``invalid``."""
    text = str(exc)
    if text.startswith("Number out of range"):
        return DeadLetterReason.OUT_OF_RANGE
    bound = _BOUND.match(text)
    if bound is not None:
        limit = float(bound[1]) if "." in bound[1] or "e" in bound[1] else int(bound[1])
        if limit in widths.LIMITS:
            return DeadLetterReason.OUT_OF_RANGE
    return DeadLetterReason.INVALID


def _explain(data: bytes, exc: msgspec.ValidationError) -> DecodeError:
    try:
        env = _envelope_decoder.decode(data)
    except msgspec.MsgspecError:
        return DecodeError(f"not an event object: {exc}", reason=DeadLetterReason.INVALID)
    except RecursionError:  # skipping a deep unknown field
        return _too_deep("$")
    if isinstance(env.v, int) and not isinstance(env.v, bool) and env.v > SCHEMA_VERSION:
        return DecodeError(
            f"schema version {env.v} is newer than supported {SCHEMA_VERSION} - at `$.v`",
            reason=DeadLetterReason.UNSUPPORTED_VERSION,
        )
    if env.type is None:
        return DecodeError(
            "missing `type`; expected one of start, step, end, score - at `$.type`",
            reason=DeadLetterReason.UNKNOWN_TYPE,
        )
    if env.type not in _KNOWN_TYPES:
        return DecodeError(
            f"unknown event type {env.type!r}; expected one of start, step, end, score - "
            "at `$.type`",
            reason=DeadLetterReason.UNKNOWN_TYPE,
        )
    if env.type == "score" and str(exc) in _NON_FINITE:
        # JSON has no infinity: msgspec refuses 1e999, and encodes NaN and inf as null
        return DecodeError(
            f"score event: {exc} (not a finite number)", reason=DeadLetterReason.NON_FINITE
        )
    return DecodeError(f"{env.type} event: {exc}", reason=_invalid(exc))


def encode(obj: StepEvent | Episode) -> bytes:
    return _encoder.encode(obj)


def encode_event(event: StepEvent, *, max_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> bytes:
    """Encode a step event for the steps topic, raising DecodeError if a worker would
    reject it (producers check with the worker's own decoder before sending)."""
    data = _encoder.encode(event)
    decode_event(data, max_bytes=max_bytes)
    return data


def decode_episode(data: bytes | None) -> Episode:
    """Decode one episodes-topic message, or raise DecodeError."""
    if not data:
        raise DecodeError(
            "message is empty; expected a JSON episode", reason=DeadLetterReason.NOT_JSON
        )
    try:
        episode = _episode_decoder.decode(data)
    except msgspec.MsgspecError as exc:
        raise DecodeError(f"not a valid episode: {exc}", reason=_invalid(exc)) from None
    except RecursionError:
        raise _too_deep("$") from None
    for i, step in enumerate(episode.steps):
        if step.data is not None or step.arguments or step.call is not None:
            _check_depth(step, f"$.steps[{i}]")
    return episode
