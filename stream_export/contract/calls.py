"""The token plane's contract: model calls as agents send them (the ``call`` of an
``llm_call`` step) and the token segments a finished episode carries.

Pure types (no I/O); ``stream_export.contract.events`` embeds them in its step and episode
records, and ``stream_export.assemble.tokens`` builds the segments.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal

import msgspec

from stream_export.contract.widths import Index, Int64, Logprob, TokenId

#: The policy version that served a call, as the inference server reports it
#: (SGLang and vLLM: an integer or a string).
WeightVersion = Int64 | Annotated[str, msgspec.Meta(max_length=256)]
_INTEGER: Final = re.compile(r"-?[0-9]+")

#: The previous call sent this very prompt again (a retry, or another sample).
REPEATED_PROMPT: Final = "repeated_prompt"
#: The prompt does not start with the previous call's prompt + completion (a
#: compacted or re-rendered history, a sub-agent, another conversation).
PREFIX_MISMATCH: Final = "prefix_mismatch"
BREAK_REASONS: Final = (REPEATED_PROMPT, PREFIX_MISMATCH)


class ToolFunction(msgspec.Struct, forbid_unknown_fields=False, gc=False):
    name: str
    arguments: Annotated[str, msgspec.Meta(description="JSON text, as OpenAI sends it.")]


class ToolCall(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True, gc=False):
    """One tool call of an assistant message, in OpenAI chat shape."""

    id: str
    function: ToolFunction
    type: Literal["function"] = "function"


class CallMessage(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True, gc=False):
    """One message sent to the model, in OpenAI chat shape."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[
        str | list[dict[str, Any]] | None,
        msgspec.Meta(description="Text, or OpenAI content parts."),
    ] = None
    name: str | None = None
    #: An assistant message's reasoning, apart from its content.
    reasoning: str | None = None
    tool_calls: list[ToolCall] | None = None
    #: A tool message answers the tool call with this id.
    tool_call_id: str | None = None


class CallRequest(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True, gc=False):
    messages: list[CallMessage]
    tools: Annotated[
        list[dict[str, Any]] | None, msgspec.Meta(description="OpenAI tool definitions.")
    ] = None


class CallResponse(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True, gc=False):
    """The assistant message the model answered with."""

    content: str | None = None
    reasoning: Annotated[
        str | None, msgspec.Meta(description="Reasoning text, kept apart from content.")
    ] = None
    tool_calls: list[ToolCall] | None = None


class LlmCall(
    msgspec.Struct, kw_only=True, forbid_unknown_fields=False, omit_defaults=True, gc=False
):
    """One model call, token for token (the ``call`` of an ``llm_call`` step)."""

    request: CallRequest
    response: CallResponse
    prompt_token_ids: Annotated[
        list[TokenId],
        msgspec.Meta(
            description="The prompt's token ids; with prompt_base, only those added after "
            "the base call's prompt and completion."
        ),
    ]
    completion_token_ids: list[TokenId]
    logprobs: Annotated[
        list[Logprob],
        msgspec.Meta(description="One per completion token, of the sampled token."),
    ]
    model: str
    weight_version: Annotated[
        WeightVersion, msgspec.Meta(description="The policy version that served the call.")
    ]
    finish_reason: str
    request_id: str
    usage: Annotated[
        dict[str, Any] | None, msgspec.Meta(description="The server's usage object.")
    ] = None
    prompt_base: Annotated[
        Index | None,
        msgspec.Meta(
            description="The seq of an earlier llm_call step of the episode whose prompt and "
            "completion this prompt continues: prompt_token_ids are then only the ids added."
        ),
    ] = None


def text_only(call: LlmCall) -> bool:
    """A call recorded without token ids (a server that returns none, e.g. a hosted
    model): no prompt or completion ids and no base. It stays in the episode's steps
    (and the rows built from messages) but is no part of any token segment."""
    return not call.prompt_token_ids and not call.completion_token_ids and call.prompt_base is None


def version_key(version: WeightVersion) -> tuple[int, int, str]:
    """How weight versions order: integers (and strings that spell one, as SGLang
    reports them) by value, before any other string, which order as text."""
    if isinstance(version, int):
        return (0, version, "")
    if _INTEGER.fullmatch(version):
        return (0, int(version), "")
    return (1, 0, version)


class CallSpan(msgspec.Struct, kw_only=True, gc=False):
    """Where one call's completion sits in its segment's ``input_ids``: tokens
    ``start`` (its prompt's length) to ``end`` (exclusive) are the ones it sampled."""

    seq: Index
    start: Index
    end: Index
    weight_version: WeightVersion


class TokenSegment(msgspec.Struct, kw_only=True, gc=False):
    """A run of calls of one episode, each continuing the previous one's prompt and
    completion token for token: one training sequence."""

    #: The last call's prompt and completion: every token of the run, in order.
    input_ids: list[TokenId]
    #: The run's calls in seq order, with the span each one sampled.
    calls: list[CallSpan]
    #: One per sampled token: the calls' logprobs, in order (``aligned_logprobs``
    #: spreads them over ``input_ids``).
    logprobs: list[Logprob]
    weight_version_min: WeightVersion
    weight_version_max: WeightVersion
    #: Why the previous run ended here (None for an episode's first segment).
    break_reason: str | None = None

    def loss_mask(self) -> list[int]:
        """1 on each token a call sampled, 0 on the others (prompt, tool output)."""
        mask = [0] * len(self.input_ids)
        for span in self.calls:
            mask[span.start : span.end] = [1] * (span.end - span.start)
        return mask

    def aligned_logprobs(self) -> list[float]:
        """``logprobs`` aligned with ``input_ids``: 0.0 where the mask is 0."""
        aligned = [0.0] * len(self.input_ids)
        taken = 0
        for span in self.calls:
            n = span.end - span.start
            aligned[span.start : span.end] = self.logprobs[taken : taken + n]
            taken += n
        return aligned


class Tokens(msgspec.Struct, kw_only=True, gc=False):
    """An episode's token plane: its calls as segments (on the episodes topic)."""

    segments: list[TokenSegment]
    #: Over every call in ``segments`` (None when there is none), see version_key.
    weight_version_min: WeightVersion | None = None
    weight_version_max: WeightVersion | None = None
    #: Seqs of llm_call steps dead-lettered as ``token_base_missing``: their
    #: prompt was a delta against a call the episode does not have. They are
    #: in neither the segments nor the episode's steps.
    base_missing: list[Index] = []
