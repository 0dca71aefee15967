"""``POST /v1/episodes/{id}/steps``: an agent's own steps (its reasoning, actions,
their results, outputs) added to a gateway episode, between its model calls.

Request ``{"batch": 0, 1, ..., "steps": [{"kind", "content", "name", "arguments",
"data", "id"}, ...]}`` (the contract's step without episode, seq and time, which
the gateway stamps; kinds ``observation``, ``thought``, ``action``,
``action_result``, ``output``, ``message``: ``llm_call`` is the gateway's own).
Answer ``{"episode_id", "batch", "first_seq", "steps"}``: the batch's first seq
and the episode's step count after it.

The guarantees a call has:

* acknowledged before answered: the batch's events go through the episode's
  outbox and the write-ahead log like a call's, and the answer waits for Kafka
  (``gateway.on_kafka_down`` as for calls);
* ordered with the calls: numbered under the episode's lock by the builder that
  numbers its calls, so a batch sent between two calls lands between them;
* once: batches are numbered; a repeat of the last batch (same number, same
  content) answers as the first did, sending the outbox again if Kafka has not
  acknowledged it; another content under that number is 409 ``batch_conflict``,
  a number past the next is 409 ``batch_out_of_order``. The next number and the
  last batch's answer are in the episode's logged state, so a restarted gateway
  answers a repeat too;
* atomic: every step is checked (kind, types, ``assemble.max_event_bytes``)
  before any takes a seq: a refused batch leaves no gap.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from stream_export.contract.events import StepEvent
from stream_export.errors import DecodeError, GatewayRefusal
from stream_export.gateway import wire
from stream_export.gateway.book import LastBatch, OpenEpisode

AgentKind = Literal["observation", "thought", "action", "action_result", "output", "message"]
#: Steps of one batch, at most (a Daydreams call's answer makes a handful).
MAX_STEPS: Final = 1000


class StepIn(msgspec.Struct, forbid_unknown_fields=False):
    kind: AgentKind
    content: str = ""
    name: str | None = None
    arguments: dict[str, Any] | None = None
    data: Any = None
    id: str | None = None


@dataclass(frozen=True)
class Batch:
    number: int
    steps: list[StepIn]
    digest: str


def parse(body: dict[str, Any]) -> Batch:
    """The request's batch; GatewayRefusal 400 ``invalid_steps`` for the envelope,
    ``invalid_step`` naming ``steps[i]`` and why."""
    number, steps = body.get("batch"), body.get("steps")
    if type(number) is not int or number < 0:
        raise GatewayRefusal(400, "batch must be 0, 1, 2, ...", reason="invalid_steps")
    if not isinstance(steps, list) or not 0 < len(steps) <= MAX_STEPS:
        raise GatewayRefusal(
            400, f"steps must be a list of 1 to {MAX_STEPS} steps", reason="invalid_steps"
        )
    parsed = []
    for i, step in enumerate(steps):
        try:
            parsed.append(msgspec.convert(step, StepIn))
        except msgspec.ValidationError as exc:
            raise GatewayRefusal(400, f"steps[{i}]: {exc}", reason="invalid_step") from None
    digest = hashlib.sha256(wire.encode({"batch": number, "steps": steps})).hexdigest()
    return Batch(number, parsed, digest)


def events(episode: OpenEpisode, batch: Batch) -> list[StepEvent]:
    """The batch's step events, numbered after the episode's steps so far; nothing
    numbered when one cannot be recorded (GatewayRefusal 400 ``invalid_step``)."""
    builder = episode.builder
    first = builder.steps
    made: list[StepEvent] = []
    for i, step in enumerate(batch.steps):
        try:
            made.append(
                builder.step(
                    step.kind,
                    step.content,
                    name=step.name,
                    arguments=step.arguments,
                    data=step.data,
                    id=step.id,
                )
            )
        except DecodeError as exc:
            builder.steps = first
            raise GatewayRefusal(400, f"steps[{i}]: {exc}", reason="invalid_step") from None
    return made


def take(episode: OpenEpisode, batch: Batch) -> tuple[dict[str, Any], list[StepEvent]]:
    """The answer to ``batch`` and the events to send (none for a repeat); the
    episode's lock held. GatewayRefusal when it is refused."""
    answer = answered_before(episode, batch)
    if answer is not None:
        return answer, []
    if episode.ended:
        raise GatewayRefusal(409, "the episode has ended", reason="episode_ended")
    made = events(episode, batch)
    answer = {
        "episode_id": episode.episode_id,
        "batch": batch.number,
        "first_seq": episode.builder.steps - len(made),
        "steps": episode.builder.steps,
    }
    episode.batches = batch.number + 1
    episode.last_batch = LastBatch(batch.number, batch.digest, answer)
    return answer, made


def answered_before(episode: OpenEpisode, batch: Batch) -> dict[str, Any] | None:
    """The answer to a batch sent before (None: a new batch); GatewayRefusal 409
    for a batch that conflicts or skips one."""
    last = episode.last_batch
    if batch.number > episode.batches:
        raise GatewayRefusal(
            409,
            f"batch {batch.number} before batch {episode.batches}: send them in order",
            reason="batch_out_of_order",
        )
    if batch.number == episode.batches:
        return None
    if last is not None and last.number == batch.number:
        if last.digest != batch.digest:
            raise GatewayRefusal(
                409,
                f"batch {batch.number} was recorded with other steps",
                reason="batch_conflict",
            )
        return last.answer
    return {"episode_id": episode.episode_id, "batch": batch.number}  # an older repeat
