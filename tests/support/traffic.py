"""Step-event traffic for the integration tests and the benchmarks (pure, no I/O).

:func:`disorder` builds episodes whose events are shuffled within each episode,
partly duplicated, sometimes without an end, interleaved across a window of
concurrent episodes, and works out what the assembler must make of them with a
deliberately simple rule of its own. ``producer.produce`` sends such traffic;
``topic_reader.EpisodeReader`` reads the episodes topic back.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from stream_export.contract.decoding import encode
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step, StepEvent

Message = tuple[bytes, bytes]


@dataclass
class Plan:
    """Messages to send, in order, and what the assembler must make of them."""

    messages: list[Message] = field(default_factory=list)
    #: episode id -> number of steps, for episodes that have an end event
    ended: dict[str, int] = field(default_factory=dict)
    #: episode id -> number of steps sent, for episodes that never end
    unended: dict[str, int] = field(default_factory=dict)
    #: expected decisions: accepted, duplicate, late
    verdicts: Counter[str] = field(default_factory=Counter)

    @property
    def episodes(self) -> int:
        return len(self.ended) + len(self.unended)


def _events(rng: random.Random, eid: str, steps: int, ended: bool) -> list[StepEvent]:
    events: list[StepEvent] = [EpisodeStart(episode_id=eid, time=0.0, agent_id="a", prompt="p")]
    events += [
        Step(episode_id=eid, time=0.0, seq=i, kind="thought", content=f"s{i}") for i in range(steps)
    ]
    if ended:
        events.append(EpisodeEnd(episode_id=eid, time=0.0, steps=steps, outcome="success"))
    return events


def _expect(events: Sequence[StepEvent], verdicts: Counter[str]) -> None:
    """The rule, independent of the implementation: first copy counts, an
    episode is complete once start, end and every step are in, later copies
    are duplicates until then and late after."""
    seen: set[tuple[str, int]] = set()
    need: int | None = None
    for event in events:
        if need is not None and len(seen) == need:
            verdicts["late"] += 1
            continue
        part = (type(event).__name__, event.seq if isinstance(event, Step) else 0)
        if part in seen:
            verdicts["duplicate"] += 1
            continue
        seen.add(part)
        verdicts["accepted"] += 1
        if isinstance(event, EpisodeEnd):
            need = event.steps + 2


def disorder(
    episodes: int,
    *,
    seed: int = 0,
    duplicates: float = 0.05,
    unended: float = 0.05,
    window: int = 50,
    max_steps: int = 8,
    span_s: float = 1.0,
) -> Plan:
    """``episodes`` episodes; ``window`` of them run concurrently (interleaved).

    Event times run from now over ``span_s`` seconds in send order, so the
    partition clocks barely move while the load is read.
    """
    rng = random.Random(seed)
    plan = Plan()
    t0 = time.time()
    queues: list[list[StepEvent]] = []
    ordered: list[StepEvent] = []
    for n in range(episodes):
        eid = f"ep-{seed}-{n}"
        steps = rng.randint(1, max_steps)
        has_end = rng.random() >= unended
        (plan.ended if has_end else plan.unended)[eid] = steps
        events = _events(rng, eid, steps, has_end)
        events += [e for e in events if rng.random() < duplicates]
        rng.shuffle(events)
        _expect(events, plan.verdicts)
        queues.append(events[::-1])  # popped from the end: sent in order
        if len(queues) >= window or n == episodes - 1:
            while queues:
                queue = rng.choice(queues)
                ordered.append(queue.pop())
                if not queue:
                    queues.remove(queue)
    step = span_s / max(1, len(ordered))
    for i, event in enumerate(ordered):
        event.time = t0 + i * step
        plan.messages.append((event.episode_id.encode(), encode(event)))
    return plan
