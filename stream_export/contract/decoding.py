"""Decoding what the topics carry: step events, finished episodes and the worker's
own records, each failure a DecodeError whose reason is a dead-letter reason.

A message a worker cannot take is never a crash: it is one of the reasons of
:class:`~stream_export.contract.reasons.DeadLetterReason` (``not_json``,
``too_large``, ``too_deep``, ``unknown_type``, ``unsupported_version``,
``out_of_range``, ...), with a detail that says what is wrong and where. Producers
check their events with the same decoder before they send (:func:`encode_event`).
"""

from __future__ import annotations

import re
from typing import Any, Final, TypeVar

import msgspec

from stream_export.contract import widths
from stream_export.contract.episode import Episode
from stream_export.contract.events import MAX_SCORE_BYTES, SCHEMA_VERSION, Score, Step, StepEvent
from stream_export.contract.groups import GroupRecord
from stream_export.contract.reasons import DeadLetterReason
from stream_export.errors import DecodeError

T = TypeVar("T")


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


_record_decoder: Final = msgspec.json.Decoder(GroupRecord)


def decode_record(data: bytes | None) -> GroupRecord:
    """One groups-topic message, or DecodeError."""
    if not data:
        raise DecodeError(
            "message is empty; expected a JSON group record", reason=DeadLetterReason.NOT_JSON
        )
    return decode_as(_record_decoder, data, "valid group record")
