"""The step events an agent sends on the steps topic (``start``, ``step``, ``end``,
``score``), keyed by episode id.

Step events are a msgspec tagged union on ``type`` ("start", "step", "end", and
"score": a reward from a judge, verifier or person, possibly after the end); every
message carries its schema major version in ``v``. Unknown fields are ignored so
producers can add fields without breaking older workers; an unknown ``type`` or a
newer major version is rejected. The Kafka key of every message is episode_id.

Times are float seconds since the Unix epoch (event time, set by the agent).

The JSON Schemas in ``topics/schemas/`` are generated from these types and the
finished episode's (:mod:`.episode`) by ``stream-export topics schemas``; a unit test
fails when they drift. What a worker rejects, and why, is :mod:`.decoding`.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

from stream_export.contract import widths
from stream_export.contract.calls import LlmCall

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


#: The end event's reward as an episode's ``rewards`` names it (and ``scores.reward``
#: reads it): no score may take this name.
END_REWARD: Final = "end_reward"
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
