"""A small simulated agent fleet: dark-room adventures and step-by-step arithmetic.

Each task (a room, a sum) is played ``ROLLOUTS`` times, as a GRPO group: its
rollouts share a fresh group id and announce the group's size, and their
outcomes differ. Each simulated agent is a script (prompt, steps, outcome). ``episodes()`` is pure
(seeded random -> step events, through the recorder's EpisodeBuilder) so tests can
use the same realistic traffic that ``stream-export demo`` sends to Kafka, where
every script is played live through the Producer's episode recorder.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from stream_export.client import Producer
from stream_export.client.recorder import EpisodeBuilder, EpisodeFields
from stream_export.contract.events import StepEvent, StepKind

#: Rollouts the demo plays of each task (the group_size of their start events).
ROLLOUTS: Final = 4


@dataclass(frozen=True)
class Action:
    kind: StepKind
    content: str
    name: str | None = None
    arguments: dict[str, Any] | None = None


@dataclass(frozen=True)
class Script:
    """One simulated episode: who, from which prompt, which steps, how it ends."""

    episode_id: str
    agent_id: str
    prompt: str
    steps: list[Action]
    success: bool
    metadata: dict[str, str]
    group_id: str
    group_size: int

    @property
    def reward(self) -> float:
        return 1.0 if self.success else 0.0

    def fields(self) -> EpisodeFields:
        """What its start event says, for a recorder."""
        return EpisodeFields(
            agent_id=self.agent_id,
            prompt=self.prompt,
            episode_id=self.episode_id,
            group_id=self.group_id,
            group_size=self.group_size,
            metadata=self.metadata,
        )

    def builder(self, clock: Callable[[], float]) -> EpisodeBuilder:
        return EpisodeBuilder(clock=clock, **self.fields())


_ROOMS = [
    ("You are in a dark room with a door to the north.", "north"),
    ("You wake up in a pitch-black cellar. Somewhere to the east, water drips.", "east"),
    ("You are in a dark room. A faint draught comes from the west.", "west"),
]
_DOOR_RESULTS = {
    True: "The door was unlocked and you were able to exit the room.",
    False: "The door is locked. You hear something shuffle behind you.",
}

_KEY_RESULTS = {
    True: "The key turns. You step out into the light.",
    False: "The key snaps in the lock. You are still trapped.",
}

Play = tuple[str, list[Action], bool, dict[str, str]]


def dark_room(task: random.Random, rng: random.Random) -> Play:
    """One rollout: ``task`` draws the room, ``rng`` how this rollout goes."""
    prompt, direction = task.choice(_ROOMS)
    unlocked = rng.random() < 0.7
    success = unlocked or rng.random() < 0.8
    steps = [
        Action("thought", "I need to find a way out. I should check if the door is locked."),
        Action("action", "try opening the door", "open_door"),
        Action("action_result", _DOOR_RESULTS[unlocked], "open_door"),
    ]
    if not unlocked:
        steps += [
            Action("thought", f"The door is locked. Feeling along the {direction} wall may help."),
            Action("action", f"search the {direction} wall", "search", {"wall": direction}),
            Action("action_result", "You find a rusty key under a loose brick.", "search"),
            Action("action", "unlock the door with the key", "use_item", {"item": "rusty key"}),
            Action("action_result", _KEY_RESULTS[success], "use_item"),
        ]
    difficulty = "easy" if unlocked else "medium"
    return prompt, steps, success, {"domain": "text-adventure", "difficulty": difficulty}


def arithmetic(task: random.Random, rng: random.Random) -> Play:
    """One rollout: ``task`` draws the sum, ``rng`` whether this rollout slips."""
    a, b, c = task.randint(2, 99), task.randint(2, 99), task.randint(2, 9)
    total = (a + b) * c
    wrong = rng.random() < 0.2
    answer = total + rng.randint(1, 9) if wrong else total
    steps = [
        Action("thought", f"First add {a} and {b}."),
        Action("action", f"calculate {a} + {b}", "calculator", {"expression": f"{a} + {b}"}),
        Action("action_result", str(a + b), "calculator"),
        Action("thought", f"Now multiply {a + b} by {c}."),
        Action(
            "action", f"calculate {a + b} * {c}", "calculator", {"expression": f"{a + b} * {c}"}
        ),
        Action("action_result", str(total), "calculator"),
        Action("output", f"The answer is {answer}."),
    ]
    prompt = f"What is ({a} + {b}) * {c}? Think step by step."
    # The answer is the ground truth of the verl export (`export --to FILE.parquet`).
    return prompt, steps, not wrong, {"domain": "math", "difficulty": "easy", "answer": str(total)}


def scripts(seed: int | None = None, agents: int = 4, rollouts: int = ROLLOUTS) -> Iterator[Script]:
    """An endless stream of simulated episodes, ``rollouts`` in a row per task."""
    rng = random.Random(seed)
    while True:
        make = rng.choice([dark_room, arithmetic])
        task = rng.getrandbits(64)
        group_id = f"task-{uuid.UUID(int=rng.getrandbits(128))}"
        for _ in range(rollouts):
            agent = f"demo-agent-{rng.randrange(agents)}"
            episode_id = str(uuid.UUID(int=rng.getrandbits(128)))
            prompt, steps, success, metadata = make(random.Random(task), rng)
            yield Script(episode_id, agent, prompt, steps, success, metadata, group_id, rollouts)


def events(script: Script, now: float) -> list[StepEvent]:
    """The script's events, 10 ms of event time apart from ``now`` on."""
    ticks = itertools.count()
    builder = script.builder(lambda: now + 0.01 * next(ticks))
    out: list[StepEvent] = [builder.start()]
    out += [
        builder.step(s.kind, s.content, name=s.name, arguments=s.arguments) for s in script.steps
    ]
    out.append(builder.end("success" if script.success else "failure", reward=script.reward))
    return out


def episodes(seed: int | None = None, agents: int = 4) -> Iterator[list[StepEvent]]:
    """An endless stream of simulated episodes (each a list of its events)."""
    for script in scripts(seed, agents):
        yield events(script, time.time())


async def play(producer: Producer, script: Script) -> None:
    """Play one script live through the episode recorder."""
    async with producer.episode(**script.fields()) as episode:
        for s in script.steps:
            await episode.step(s.kind, s.content, name=s.name, arguments=s.arguments)
        await episode.end("success" if script.success else "failure", reward=script.reward)


async def run(
    bootstrap: str | Producer,
    topic: str = "",
    *,
    rate: float,
    count: int | None,
    seed: int | None = None,
) -> int:
    """Send ``count`` episodes (forever if None) at about ``rate`` episodes/s.

    ``bootstrap`` is a broker address (with ``topic``), or a configured Producer.
    """
    producer = bootstrap if isinstance(bootstrap, Producer) else Producer(bootstrap, topic=topic)
    sent = 0
    async with producer:
        for script in itertools.islice(scripts(seed), count):
            await play(producer, script)
            sent += 1
            if rate > 0:
                await asyncio.sleep(1.0 / rate)
    return sent
