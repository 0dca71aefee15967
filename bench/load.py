"""The pipeline benchmark's load: tests.support.traffic's plan, padded to a message size."""

from __future__ import annotations

import msgspec

from stream_export.contract.decoding import decode_event, encode
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step
from tests.support.traffic import Plan


def pad(plan: Plan, size: int) -> Plan:
    """``plan`` with each message grown to about ``size`` bytes (never shrunk).

    The filler goes into the text an agent would send (a start's prompt, a step's
    content, an end's metadata). Its length is worked out with one reference time
    for all, so the copies of a duplicated event (which differ only in their time
    stamps) get the same filler and stay duplicates: the verdicts stay as planned.
    """
    messages = []
    reference = _typical_time([decode_event(value).time for _, value in plan.messages])
    for key, value in plan.messages:
        event = decode_event(value)
        missing = size - len(encode(msgspec.structs.replace(event, time=reference)))
        if missing > 0:
            if isinstance(event, Step):
                event = msgspec.structs.replace(event, content=event.content + "x" * missing)
            elif isinstance(event, EpisodeStart):
                event = msgspec.structs.replace(event, prompt=f"{event.prompt}{'x' * missing}")
            elif isinstance(event, EpisodeEnd):
                # '"metadata":{"pad":""}' and a comma: 21 bytes before the filler
                filler = "x" * max(0, missing - 21)
                event = msgspec.structs.replace(event, metadata={**event.metadata, "pad": filler})
        messages.append((key, encode(event)))
    return Plan(
        messages=messages,
        ended=dict(plan.ended),
        unended=dict(plan.unended),
        verdicts=plan.verdicts.copy(),
    )


def _typical_time(times: list[float]) -> float:
    """A time stamp whose spelling has the median length: padding against the first
    event's time alone left the mean size off by up to 6 bytes whenever that one
    time happened to spell short (1 decimal) or long (7)."""
    if not times:
        return 0.0
    return sorted(times, key=lambda t: len(msgspec.json.encode(t)))[len(times) // 2]


def mean_size(plan: Plan) -> float:
    return sum(len(value) for _, value in plan.messages) / max(1, len(plan.messages))
