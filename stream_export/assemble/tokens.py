"""The token plane of a finished episode: its model calls as token segments (pure).

A call whose ``prompt_base`` names an earlier call sent only the prompt ids added
after that call's prompt and completion; its full prompt is the base's prompt +
completion + those ids. A base the episode does not have (never arrived, not an
``llm_call`` step, or itself without its base) is never guessed: the call is
left out and reported in ``Tokens.base_missing`` (the assembler dead-letters it
as ``token_base_missing``).

Calls are then taken in seq order: a call whose prompt starts with the previous
call's prompt + completion continues its segment; any other call starts a new
one, with the reason the previous one broke (``calls.BREAK_REASONS``). Text-only
calls (``calls.text_only``) are in no segment. A call's
prompt + completion is always a prefix of its segment's ``input_ids`` (segments
only grow at the end), so a base is remembered as (segment, length) at no cost,
and a delta against the previous call extends its segment in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from stream_export.contract.calls import (
    PREFIX_MISMATCH,
    REPEATED_PROMPT,
    CallSpan,
    LlmCall,
    Tokens,
    TokenSegment,
    WeightVersion,
    text_only,
    version_key,
)
from stream_export.contract.events import Step


@dataclass(frozen=True, slots=True)
class Plane:
    """The token plane and the steps to publish with it: in seq order, without the
    calls in ``tokens.base_missing``, each call's token arrays emptied."""

    tokens: Tokens
    steps: list[Step]


@dataclass(slots=True)
class _Run:
    ids: list[int]
    reason: str | None
    spans: list[CallSpan] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    def take(self, seq: int, call: LlmCall) -> None:
        start = len(self.ids)
        self.ids += call.completion_token_ids
        self.logprobs += call.logprobs
        self.spans.append(
            CallSpan(seq=seq, start=start, end=len(self.ids), weight_version=call.weight_version)
        )

    def segment(self) -> TokenSegment:
        low, high = _range(self.spans)
        return TokenSegment(
            input_ids=self.ids,
            calls=self.spans,
            logprobs=self.logprobs,
            weight_version_min=low,
            weight_version_max=high,
            break_reason=self.reason,
        )


def token_plane(steps: Sequence[Step]) -> Plane | None:
    """The token plane of an episode's steps (in seq order, one per seq); None when
    none of them is an ``llm_call``."""
    if all(step.call is None for step in steps):
        return None
    #: seq -> (run, length): that call's prompt + completion is run.ids[:length].
    done: dict[int, tuple[_Run, int]] = {}
    runs: list[_Run] = []
    missing: list[int] = []
    kept: list[Step] = []
    for step in steps:
        call = step.call
        if call is None or text_only(call):
            kept.append(step)
            continue
        run = runs[-1] if runs else None
        base = call.prompt_base
        if base is None:
            prompt: list[int] | None = call.prompt_token_ids
        elif base not in done:
            missing.append(step.seq)
            continue
        else:
            base_run, length = done[base]
            if base_run is run and length == len(run.ids):  # continues the previous call
                run.ids += call.prompt_token_ids
                prompt = None
            else:
                prompt = base_run.ids[:length] + call.prompt_token_ids
        if prompt is not None:
            if run is None or not _extends(prompt, run):
                run = _Run([], None if run is None else _why(prompt, run))
                runs.append(run)
                run.ids += prompt
            else:
                run.ids += prompt[len(run.ids) :]
        assert run is not None  # set above whenever prompt is None
        run.take(step.seq, call)
        done[step.seq] = (run, len(run.ids))
        kept.append(_without_tokens(step, call))
    tokens = _tokens([run.segment() for run in runs], missing)
    return Plane(tokens, kept)


def tokens_upto(tokens: Tokens, last_seq: int) -> Tokens:
    """``tokens`` with only the calls up to step ``last_seq`` (an episode cut to fit
    its record: a segment cut after a call is that call's prompt + completion)."""
    segments = []
    for seg in tokens.segments:
        spans = [span for span in seg.calls if span.seq <= last_seq]
        if len(spans) == len(seg.calls):
            segments.append(seg)
        elif spans:
            low, high = _range(spans)
            sampled = sum(span.end - span.start for span in spans)
            segments.append(
                msgspec.structs.replace(
                    seg,
                    input_ids=seg.input_ids[: spans[-1].end],
                    calls=spans,
                    logprobs=seg.logprobs[:sampled],
                    weight_version_min=low,
                    weight_version_max=high,
                )
            )
    return _tokens(segments, tokens.base_missing)


def _tokens(segments: list[TokenSegment], base_missing: list[int]) -> Tokens:
    if not segments:
        return Tokens(segments=segments, base_missing=base_missing)
    low = min((s.weight_version_min for s in segments), key=version_key)
    high = max((s.weight_version_max for s in segments), key=version_key)
    return Tokens(
        segments=segments,
        weight_version_min=low,
        weight_version_max=high,
        base_missing=base_missing,
    )


def _extends(prompt: list[int], run: _Run) -> bool:
    ids = run.ids
    return len(prompt) >= len(ids) and prompt[: len(ids)] == ids


def _why(prompt: list[int], run: _Run) -> str:
    last = run.spans[-1]
    return REPEATED_PROMPT if prompt == run.ids[: last.start] else PREFIX_MISMATCH


def _without_tokens(step: Step, call: LlmCall) -> Step:
    bare = msgspec.structs.replace(
        call, prompt_token_ids=[], completion_token_ids=[], logprobs=[], prompt_base=None
    )
    return msgspec.structs.replace(step, call=bare)


def _range(spans: Sequence[CallSpan]) -> tuple[WeightVersion, WeightVersion]:
    versions = [span.weight_version for span in spans]
    return min(versions, key=version_key), max(versions, key=version_key)
