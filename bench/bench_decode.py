"""Decode throughput of the step-event contract on one core (not a test).

    python -m bench.bench_decode [--events N] [--repeat R] [--cpu C]

Decodes ~300-byte step events with ``decode_event`` (the worker's hot path: size
check, msgspec decode into the tagged union, version check) and compares it with a
bare msgspec decode of the same union and with the standard library's json.loads.
The bar is 1,000,000 events/s; the best of R runs is reported (the machine is shared).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import msgspec

from stream_export.contract.decoding import decode_event, encode
from stream_export.contract.events import Step, StepEvent

BAR = 1_000_000
TARGET_BYTES = 300


def sample_events(count: int = 1000) -> list[bytes]:
    """Distinct step events of about 300 bytes each (an action with arguments)."""
    out = []
    for i in range(count):
        event = Step(
            episode_id=f"3f2b6c1e-8d4a-4f7e-9b1a-{i:012x}",
            time=1767225600.0 + i / 1000,
            seq=i % 50,
            kind="action",
            content="t",
            name="open_door",
            arguments={"direction": "north", "force": False, "attempt": i % 7},
        )
        pad = TARGET_BYTES - len(encode(event)) + 1
        event.content = ("try opening the door to the north " * 10)[:pad]
        out.append(encode(event))
    return out


def rates(
    candidates: dict[str, Callable[[bytes], Any]], messages: list[bytes], total: int, repeat: int
) -> dict[str, float]:
    """Best events/s of each candidate over ``repeat`` rounds of ``total`` decodes;
    candidates take turns within a round, so load from other processes hits all alike."""
    rounds = max(1, total // len(messages))
    best = dict.fromkeys(candidates, 0.0)
    for _ in range(repeat):
        for name, decode in candidates.items():
            began = time.perf_counter()
            for _ in range(rounds):
                for message in messages:
                    decode(message)
            elapsed = time.perf_counter() - began
            best[name] = max(best[name], rounds * len(messages) / elapsed)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=1_000_000, help="decodes per run")
    p.add_argument("--repeat", type=int, default=5, help="runs; the best is reported")
    p.add_argument("--cpu", type=int, default=0, help="pin to this core (-1: do not pin)")
    args = p.parse_args()
    if args.cpu >= 0 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {args.cpu})

    messages = sample_events()
    for message in messages[:50]:
        assert isinstance(decode_event(message), Step)
    size = sum(map(len, messages)) / len(messages)
    bare = msgspec.json.Decoder(StepEvent).decode
    candidates: dict[str, Callable[[bytes], Any]] = {
        "decode_event": decode_event,
        "msgspec decode only": bare,
        "json.loads (stdlib)": json.loads,
    }
    results = rates(candidates, messages, args.events, args.repeat)
    ours = results["decode_event"]
    print(f"step events of {size:.0f} bytes, {args.events:,} decodes x {args.repeat} runs (best)")
    for name, value in results.items():
        print(f"  {name:22s} {value:>12,.0f} events/s  {value * size / 1e6:7.1f} MB/s")
    print(f"  decode_event / msgspec decode only: {ours / results['msgspec decode only']:.2f}")
    print(f"  decode_event / json.loads:          {ours / results['json.loads (stdlib)']:.2f}")
    verdict = "meets" if ours >= BAR else "MISSES"
    print(f"  {verdict} the bar of {BAR:,} events/s ({ours / BAR:.2f}x)")


if __name__ == "__main__":
    main()
