"""Formatting must never be the bottleneck: throughput against the pipeline's ceiling.

    python -m bench.bench_formats [--episodes 2000] [--seconds 1.0]

For every built-in format and granularity (and a filtered and a custom-formatter
run) it decodes finished demo episodes from their episodes-topic bytes and formats
them, as the sink does per episode, and reports step events per second: the
steps-topic messages (start, steps, end) those episodes were built from. The
ratio is against the pipeline's measured ceiling, a bare Faust agent that only
decodes (11-13k events/s on this machine, design notes); the goal is >= 10x.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from stream_export.contract.decoding import decode_episode, encode
from stream_export.contract.episode import Episode
from stream_export.contract.events import EpisodeEnd, EpisodeStart, Step
from stream_export.ops import demo
from stream_export.output.formatter import build
from stream_export.rows.episode import prompt_text
from stream_export.runtime.metrics import Metrics
from stream_export.settings.format import FormatSettings

PIPELINE_CEILING = 13_000.0
GOAL = 10.0
CASES: dict[str, dict[str, Any]] = {
    "text (default)": {},
    "text, no metadata": {"metadata_mode": "none"},
    "text per step": {"granularity": "step"},
    "conversational": {"format": "conversational"},
    "conversational per step": {"format": "conversational", "granularity": "step"},
    "episode": {"format": "episode"},
    "episode per step": {"format": "episode", "granularity": "step"},
    "text, success only": {"only_success": True, "min_steps": 2},
    "custom (dotted path)": {"format": "bench.bench_formats:custom_record"},
}


def custom_record(episode: Episode) -> dict[str, Any]:
    """A typical small custom formatter: prompt text plus the reward."""
    return {"prompt": prompt_text(episode.prompt), "reward": episode.reward}


def episode_bytes(count: int, seed: int) -> tuple[list[bytes], int, int]:
    """Encoded demo episodes, with how many events and Step events they came from."""
    out: list[bytes] = []
    events = steps = 0
    for batch in demo.episodes(seed):
        if len(out) == count:
            break
        start = next(e for e in batch if isinstance(e, EpisodeStart))
        end = next(e for e in batch if isinstance(e, EpisodeEnd))
        step_events = [e for e in batch if isinstance(e, Step)]
        episode = Episode(
            episode_id=start.episode_id,
            agent_id=start.agent_id,
            prompt=start.prompt,
            steps=step_events,
            start_time=start.time,
            end_time=end.time,
            outcome=end.outcome,
            group_id=start.group_id,
            reward=end.reward,
            metadata={**start.metadata, **end.metadata},
        )
        out.append(encode(episode))
        events += len(batch)
        steps += len(step_events)
    return out, events, steps


def measure(settings: FormatSettings, data: list[bytes], seconds: float) -> tuple[float, int]:
    """Passes over ``data`` per second (decode + format), and lines per pass."""
    formatter = build(settings, Metrics())
    lines = sum(len(formatter(decode_episode(raw))) for raw in data)
    passes = 0
    began = time.perf_counter()
    while (elapsed := time.perf_counter() - began) < seconds or passes < 3:
        for raw in data:
            formatter(decode_episode(raw))
        passes += 1
    return passes / elapsed, lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    data, events, steps = episode_bytes(args.episodes, args.seed)
    print(
        f"{len(data)} demo episodes, {events} step events ({steps} of type step), "
        f"pipeline ceiling {PIPELINE_CEILING:,.0f} events/s, goal {GOAL:.0f}x"
    )
    print(f"{'case':26} {'episodes/s':>11} {'lines/s':>10} {'events/s':>10} {'ratio':>7}")
    worst = float("inf")
    for name, overrides in CASES.items():
        rate, lines = measure(FormatSettings(**overrides), data, args.seconds)
        ratio = rate * events / PIPELINE_CEILING
        worst = min(worst, ratio)
        print(
            f"{name:26} {rate * len(data):11,.0f} {rate * lines:10,.0f} "
            f"{rate * events:10,.0f} {ratio:6.1f}x"
        )
    verdict = "meets" if worst >= GOAL else "MISSES"
    print(f"slowest case: {worst:.1f}x the pipeline ceiling ({verdict} the {GOAL:.0f}x goal)")


if __name__ == "__main__":
    main()
