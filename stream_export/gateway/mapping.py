"""OpenAI requests and answers <-> what an ``llm_call`` step records (pure, no I/O).

The gateway asks the upstream for more than the client did (token ids, the sampled
tokens' logprobs) and strips it again, so the agent sees an ordinary answer:
``upstream_request`` adds, ``strip`` removes, and ``sampled`` / ``StreamGather``
take what the call records from a whole answer or from a stream's chunks. vLLM's
spelling: chat answers carry ``prompt_token_ids`` at the top level (a stream: in
its first chunk) and ``choices[].token_ids``, with logprobs in
``logprobs.content[].logprob``; completions carry both id lists in the choice and
logprobs in ``logprobs.token_logprobs``.

An answer without prompt token ids (a hosted model, any OpenAI-compatible server
that has none, or ``gateway.capture_tokens=false``) is a text-only call: its
request and answer are recorded with empty token arrays.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from stream_export.contract.calls import (
    CallMessage,
    CallRequest,
    CallResponse,
    ToolCall,
    ToolFunction,
    WeightVersion,
    version_key,
)
from stream_export.errors import GatewayRequestError, UpstreamError

Json = dict[str, Any]
Endpoint = Literal["chat", "completions"]
#: The finish_reason recorded for a stream the client left before its end.
ABORTED: Final = "aborted"


@dataclass(frozen=True)
class Asked:
    """What the client asked for itself (the gateway strips the rest)."""

    logprobs: bool
    token_ids: bool


@dataclass
class Sampled:
    """What the upstream sampled for one call: the ``llm_call``'s fields."""

    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    response: CallResponse
    model: str
    finish_reason: str
    request_id: str
    usage: Json | None = None
    #: The version the upstream says served the call (SGLang's ``weight_version``,
    #: top level or in ``metadata``); it wins over the gateway's stamp.
    weight_version: WeightVersion | None = None

    @property
    def text_only(self) -> bool:
        """Whether the call has no token ids (see the module's docstring)."""
        return not self.prompt_token_ids and not self.completion_token_ids


def served_by(call: Sampled, stamp: WeightVersion | None) -> WeightVersion:
    """The weight version a call records: the upstream's own, else the fence's
    ``stamp``, else (no fence) the model name the server answered with."""
    if call.weight_version is not None:
        return call.weight_version
    return stamp if stamp is not None else call.model


def upstream_request(endpoint: Endpoint, body: Json, *, tokens: bool = True) -> tuple[Json, Asked]:
    """The body to send upstream (token ids and logprobs asked for, unless not
    ``tokens``) and what the client asked itself. A request for several choices is
    refused: a call records one sampled completion."""
    if body.get("n", 1) not in (1, None) or body.get("best_of", 1) not in (1, None):
        raise GatewayRequestError("n and best_of must be 1: a recorded call is one completion")
    sent = dict(body)
    if endpoint == "chat":
        asked = Asked(logprobs=bool(body.get("logprobs")), token_ids=_asked_ids(body))
    else:
        asked = Asked(logprobs=body.get("logprobs") is not None, token_ids=_asked_ids(body))
    if not tokens:
        return sent, asked
    sent["return_token_ids"] = True
    if endpoint == "chat":
        sent["logprobs"] = True
    elif body.get("logprobs") is None:
        sent["logprobs"] = 1
    return sent, asked


def _asked_ids(body: Json) -> bool:
    return bool(body.get("return_token_ids"))


def call_request(endpoint: Endpoint, body: Json, max_bytes: int) -> CallRequest:
    """The ``request`` an ``llm_call`` records: the chat messages and tools, or a
    completion's prompt as one user message. GatewayRequestError ``call_too_large``
    when it alone is larger than ``max_bytes`` (assemble.max_event_bytes): its
    ``llm_call`` could not be recorded, so the upstream is not asked."""
    if endpoint == "completions":
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            raise GatewayRequestError(
                "prompt must be one string (token-id and batch prompts are not recorded)"
            )
        request = CallRequest(messages=[CallMessage(role="user", content=prompt)])
    else:
        try:
            request = msgspec.convert(
                {"messages": body.get("messages"), "tools": body.get("tools")}, CallRequest
            )
        except msgspec.ValidationError as exc:
            raise GatewayRequestError(f"messages: {exc}") from None
    if len(msgspec.json.encode(request)) > max_bytes:
        raise GatewayRequestError(
            f"the call's messages are larger than {max_bytes} bytes "
            "(assemble.max_event_bytes): it cannot be recorded",
            reason="call_too_large",
        )
    return request


def strip(answer: Json, asked: Asked) -> Json:
    """The answer (or a stream chunk) without what the gateway added."""
    if asked.logprobs and asked.token_ids:
        return answer
    out = copy.copy(answer)
    if not asked.token_ids:
        out.pop("prompt_token_ids", None)
    choices = []
    for choice in answer.get("choices") or []:
        choice = dict(choice)
        if not asked.token_ids:
            choice.pop("token_ids", None)
            choice.pop("prompt_token_ids", None)
        if not asked.logprobs and "logprobs" in choice:
            choice["logprobs"] = None
        choices.append(choice)
    if "choices" in answer:
        out["choices"] = choices
    return out


def sampled(endpoint: Endpoint, answer: Json, *, tokens: bool = True) -> Sampled:
    """What a whole (non-streaming) answer sampled; UpstreamError when its token ids
    and logprobs do not match, or it is not one choice."""
    choice = _one_choice(answer)
    gather = StreamGather(endpoint, tokens=tokens)
    gather.feed(answer, whole=True)
    if endpoint == "chat":
        gather.response = _message(choice.get("message") or {})
    gather.finish_reason = choice.get("finish_reason") or gather.finish_reason
    return gather.result()


def _one_choice(answer: Json) -> Json:
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        raise UpstreamError("the answer does not have exactly one choice")
    choice: Json = choices[0]
    return choice


def _message(message: Json) -> CallResponse:
    try:
        return CallResponse(
            content=message.get("content"),
            reasoning=message.get("reasoning") or message.get("reasoning_content"),
            tool_calls=msgspec.convert(message.get("tool_calls") or None, list[ToolCall] | None),
        )
    except (msgspec.ValidationError, TypeError) as exc:
        raise UpstreamError(f"the answer's message: {exc}") from None


@dataclass
class _ToolCallParts:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


@dataclass
class StreamGather:
    """A call's tokens, logprobs and message put together from its chunks (or from a
    whole answer: one chunk with ``whole=True``); without ``tokens``, text only."""

    endpoint: Endpoint
    tokens: bool = True
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, _ToolCallParts] = field(default_factory=dict)
    response: CallResponse | None = None
    model: str = ""
    request_id: str = ""
    finish_reason: str = ""
    usage: Json | None = None
    weight_version: WeightVersion | None = None

    def feed(self, chunk: Json, *, whole: bool = False) -> None:
        """Take one chunk (or a whole answer); UpstreamError if it is malformed."""
        try:
            self._feed(chunk, whole)
        except (TypeError, KeyError, AttributeError, ValueError, msgspec.ValidationError) as exc:
            raise UpstreamError(f"an answer the gateway cannot read: {exc!r}") from None

    def _feed(self, chunk: Json, whole: bool) -> None:
        self.model = chunk.get("model") or self.model
        self.request_id = chunk.get("id") or self.request_id
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        self._version(chunk)
        prompt = chunk.get("prompt_token_ids")
        for choice in chunk.get("choices") or []:
            prompt = choice.get("prompt_token_ids") or prompt
            ids = choice.get("token_ids")
            if self.tokens and ids is not None:
                logprobs = _logprobs(self.endpoint, choice.get("logprobs"))
                if len(logprobs) != len(ids):
                    raise UpstreamError(f"{len(ids)} token ids but {len(logprobs)} logprobs")
                self.completion_token_ids += [int(i) for i in ids]
                self.logprobs += logprobs
            self.finish_reason = choice.get("finish_reason") or self.finish_reason
            if self.endpoint == "completions":
                self.content.append(choice.get("text") or "")
            elif not whole:
                self._delta(choice.get("delta") or {})
        if prompt is not None and self.tokens:
            self.prompt_token_ids = [int(i) for i in prompt]

    def _version(self, chunk: Json) -> None:
        """The upstream's own weight version; the oldest, if chunks report several."""
        metadata = chunk.get("metadata")
        found = chunk.get("weight_version")
        if found is None and isinstance(metadata, dict):
            found = metadata.get("weight_version")
        if found is None:
            return
        version: WeightVersion = msgspec.convert(found, WeightVersion)
        if self.weight_version is None or version_key(version) < version_key(self.weight_version):
            self.weight_version = version

    def _delta(self, delta: Json) -> None:
        self.content.append(delta.get("content") or "")
        self.reasoning.append(delta.get("reasoning") or delta.get("reasoning_content") or "")
        for part in delta.get("tool_calls") or []:
            parts = self.tool_calls.setdefault(int(part.get("index", 0)), _ToolCallParts())
            parts.id = part.get("id") or parts.id
            function = part.get("function") or {}
            parts.name = function.get("name") or parts.name
            parts.arguments.append(function.get("arguments") or "")

    def result(self, *, aborted: bool = False) -> Sampled:
        """The call so far; ``aborted``: the client left, and finish_reason says so.
        Without prompt token ids it is text-only (no completion ids or logprobs)."""
        if self.prompt_token_ids is None:
            self.completion_token_ids, self.logprobs = [], []
        response = self.response or CallResponse(
            content="".join(self.content) or None,
            reasoning="".join(self.reasoning) or None,
            tool_calls=[
                ToolCall(
                    id=parts.id,
                    function=ToolFunction(name=parts.name, arguments="".join(parts.arguments)),
                )
                for _, parts in sorted(self.tool_calls.items())
            ]
            or None,
        )
        return Sampled(
            prompt_token_ids=self.prompt_token_ids or [],
            completion_token_ids=self.completion_token_ids,
            logprobs=self.logprobs,
            response=response,
            model=self.model,
            finish_reason=ABORTED if aborted else self.finish_reason or "unknown",
            request_id=self.request_id,
            usage=self.usage,
            weight_version=self.weight_version,
        )


def _logprobs(endpoint: Endpoint, logprobs: Json | None) -> list[float]:
    if not logprobs:
        return []
    if endpoint == "chat":
        return [float(entry["logprob"]) for entry in logprobs.get("content") or []]
    return [float(value) for value in logprobs.get("token_logprobs") or []]
