"""Logs played to their end in the stage simulator, faults or not, and what they published."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

import msgspec

from stream_export import settings
from stream_export.contract.episode import Episode
from stream_export.groups.regroup import FROM_HEADER, SOURCE_HEADER
from stream_export.runtime.stage import CONTROL_HEADER, TICK
from tests.support.stage_sim import Broker, Msg, World, group_stage

PARTITIONS = 3
T0 = 1_000_000.0
TICK_HEADERS = ((CONTROL_HEADER, TICK),)


def groups_logic(s: settings.Settings) -> Any:
    return lambda worker: group_stage(worker, s)


def rollout_log(rng: random.Random, again: bool = False) -> dict[int, list[Msg]]:
    """Rollouts of 24 groups (1-6 each, some short of their size, some sent twice by
    their agent, some forwarded twice from one position as after a crash, a few
    with another prompt), in random order with watermarks of 2 sources between
    them, on the repartition topic's partitions; then a watermark far ahead. With
    ``again``, the rollouts after a random point are then forwarded once more (a
    regroup stage restarted from its committed position, after their groups were
    closed and forgotten), and another watermark follows."""
    per: dict[int, list[tuple[bytes | None, bytes, tuple[tuple[str, bytes], ...]]]]
    per = defaultdict(list)
    position = 0
    messages = []
    for g in range(24):
        size = rng.randint(1, 6)
        sent = size if rng.random() < 0.7 else rng.randint(1, size)
        for i in range(sent):
            prompt = "other" if rng.random() < 0.05 else f"task {g}"
            episode = Episode(
                episode_id=f"g{g}-r{i}",
                agent_id="a",
                prompt=prompt,
                steps=[],
                start_time=T0 + g,
                end_time=T0 + g + i,
                outcome="success",
                group_id=f"g{g}",
                group_size=size,
                reward=float(rng.randint(0, 3)),
            )
            value = msgspec.json.encode(episode)
            copies = 2 if rng.random() < 0.1 else 1  # the agent sent it twice
            for _ in range(copies):
                position += 1
                forwarded = 2 if rng.random() < 0.1 else 1  # regroup forwarded again
                where = ((FROM_HEADER, f"0:{position}".encode()),)
                messages += [(f"g{g}".encode(), value, where)] * forwarded
    rng.shuffle(messages)
    for i, (key, value, headers) in enumerate(messages):
        p = sum(key) % PARTITIONS
        per[p].append((key, value, headers))
        if i % 10 == 9:  # watermarks from both sources, to every partition
            wall = T0 + i / 2
            for q in range(PARTITIONS):
                for source in (0, 1):
                    mark = (*TICK_HEADERS, (SOURCE_HEADER, str(source).encode()))
                    per[q].append((b"", str(wall).encode(), mark))
    for ahead in (1e6, 2e6) if again else (1e6,):
        if ahead == 2e6:
            for key, value, headers in messages[rng.randrange(len(messages)) :]:
                per[sum(key) % PARTITIONS].append((key, value, headers))
        for q in range(PARTITIONS):
            for source in (0, 1):
                mark = (*TICK_HEADERS, (SOURCE_HEADER, str(source).encode()))
                per[q].append((b"", str(T0 + ahead).encode(), mark))
    return {
        p: [Msg(p, o, k, v, h) for o, (k, v, h) in enumerate(per[p])] for p in range(PARTITIONS)
    }


def play(
    log: dict[int, list[Msg]], make: Any, seed: int, *, faults: bool, drop: float = 0.0
) -> Broker:
    """Run the log to its end: one worker without faults, or up to three with kills
    (some in the middle of a persist) and rebalances at random moments."""
    rng = random.Random(seed)
    broker = Broker(log)
    world = World(broker, make, rng, wall=T0 + 10)
    world.start()
    if faults:
        world.start()
    world.rebalance()
    while True:
        if faults and rng.random() < 0.08:
            event = rng.random()
            if event < 0.4 and world.workers:
                victim = rng.choice(list(world.workers.values()))
                victim.budget = rng.randint(0, 12)  # dies within its next few effects
            elif event < 0.7 or not world.workers:
                if len(world.workers) < 3:
                    world.start()
                world.rebalance_safely()
            else:
                world.rebalance_safely()
        if not world.workers:
            world.start()
            world.rebalance_safely()
        if not world.step(drop if faults else 0.0):
            # all fetched: make it durable; a kill on the way restarts the round
            for worker in list(world.workers.values()):
                worker.budget = None
            world.rebalance_safely()
            if all(w.fetch == {p: len(log[p]) for p in w.fetch} for w in world.workers.values()):
                break
    return broker


def outputs(broker: Broker, topic: str) -> dict[bytes, set[bytes]]:
    found: dict[bytes, set[bytes]] = defaultdict(set)
    for op in broker.delivered(topic):
        assert op.key is not None and op.value is not None
        found[op.key].add(op.value)
    return found


def dead(broker: Broker) -> set[tuple[bytes, bytes]]:
    return {(dict(op.headers)["x-reason"], op.key or b"") for op in broker.delivered("dead")}
