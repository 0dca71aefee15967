"""A small simulated agent fleet: dark-room adventures and step-by-step arithmetic.

``episodes()`` is pure (seeded random -> step events) so tests can use the same
realistic traffic that ``stream-export demo`` sends to Kafka.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Iterator

from stream_export.events import EpisodeEnd, EpisodeStart, Step, StepEvent, StepKind

_ROOMS = [
    ("You are in a dark room with a door to the north.", "north"),
    ("You wake up in a pitch-black cellar. Somewhere to the east, water drips.", "east"),
    ("You are in a dark room. A faint draught comes from the west.", "west"),
]
_DOOR_RESULTS = {
    True: "The door was unlocked and you were able to exit the room.",
    False: "The door is locked. You hear something shuffle behind you.",
}


def dark_room(rng: random.Random, episode_id: str, agent_id: str, now: float) -> list[StepEvent]:
    prompt, direction = rng.choice(_ROOMS)
    unlocked = rng.random() < 0.7
    steps: list[tuple[StepKind, str, str | None]] = [
        ("thought", "I need to find a way out. I should check if the door is locked.", None),
        ("action", "try opening the door", "open_door"),
        ("action_result", _DOOR_RESULTS[unlocked], "open_door"),
    ]
    if not unlocked:
        steps += [
            ("thought", f"The door is locked. Feeling along the {direction} wall may help.", None),
            ("action", f"search the {direction} wall", "search"),
            ("action_result", "You find a rusty key under a loose brick.", "search"),
            ("action", "unlock the door with the key", "use_item"),
            ("action_result", "The key turns. You step out into the light.", "use_item"),
        ]
    success = unlocked or rng.random() < 0.8
    return _episode(
        episode_id,
        agent_id,
        now,
        prompt,
        steps,
        success,
        {"domain": "text-adventure", "difficulty": "easy" if unlocked else "medium"},
    )


def arithmetic(rng: random.Random, episode_id: str, agent_id: str, now: float) -> list[StepEvent]:
    a, b, c = rng.randint(2, 99), rng.randint(2, 99), rng.randint(2, 9)
    total = (a + b) * c
    wrong = rng.random() < 0.2
    answer = total + rng.randint(1, 9) if wrong else total
    steps: list[tuple[StepKind, str, str | None]] = [
        ("thought", f"First add {a} and {b}.", None),
        ("action", f"calculate {a} + {b}", "calculator"),
        ("action_result", str(a + b), "calculator"),
        ("thought", f"Now multiply {a + b} by {c}.", None),
        ("action", f"calculate {a + b} * {c}", "calculator"),
        ("action_result", str(total), "calculator"),
        ("output", f"The answer is {answer}.", None),
    ]
    return _episode(
        episode_id,
        agent_id,
        now,
        f"What is ({a} + {b}) * {c}? Think step by step.",
        steps,
        not wrong,
        {"domain": "math", "difficulty": "easy"},
    )


def _episode(
    episode_id: str,
    agent_id: str,
    now: float,
    prompt: str,
    steps: list[tuple[StepKind, str, str | None]],
    success: bool,
    metadata: dict[str, str],
) -> list[StepEvent]:
    events: list[StepEvent] = [
        EpisodeStart(
            episode_id=episode_id,
            time=now,
            agent_id=agent_id,
            prompt=prompt,
            group_id=f"task-{abs(hash(prompt)) % 1000}",
            metadata=dict(metadata),
        )
    ]
    for seq, (kind, content, name) in enumerate(steps):
        events.append(
            Step(
                episode_id=episode_id,
                time=now + 0.01 * (seq + 1),
                seq=seq,
                kind=kind,
                content=content,
                name=name,
            )
        )
    events.append(
        EpisodeEnd(
            episode_id=episode_id,
            time=now + 0.01 * (len(steps) + 1),
            steps=len(steps),
            outcome="success" if success else "failure",
            reward=1.0 if success else 0.0,
        )
    )
    return events


def episodes(seed: int | None = None, agents: int = 4) -> Iterator[list[StepEvent]]:
    """An endless stream of simulated episodes (each a list of its events)."""
    rng = random.Random(seed)
    while True:
        agent = f"demo-agent-{rng.randrange(agents)}"
        make = rng.choice([dark_room, arithmetic])
        yield make(rng, str(uuid.UUID(int=rng.getrandbits(128))), agent, time.time())


async def run(
    bootstrap: str, topic: str, *, rate: float, count: int | None, seed: int | None = None
) -> int:
    """Send ``count`` episodes (forever if None) at about ``rate`` episodes/s."""
    from aiokafka import AIOKafkaProducer

    from stream_export.events import encode

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5
    )
    await producer.start()
    sent = 0
    try:
        for events in episodes(seed):
            if count is not None and sent >= count:
                break
            for event in events:
                await producer.send(topic, encode(event), key=event.episode_id.encode())
            sent += 1
            if rate > 0:
                await asyncio.sleep(1.0 / rate)
        await producer.flush()
    finally:
        await producer.stop()
    return sent
