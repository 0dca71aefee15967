"""A trainer's loop on the feed (``stream_export.feed``): it takes closed GRPO groups,
shapes each batch as TRL's GRPO trainer takes one (prompts, completions, rewards,
advantages; token rows with ``--source tokens``), trains nothing, and acknowledges
the batch after the "step". Stop it at any moment (kill -9 included): what it did
not acknowledge is delivered again to the next run of the same ``--group``.

    python examples/trainer_feed.py --set kafka.bootstrap_servers=127.0.0.1:9092 \\
        --group trainer --batch-size 8 --batches 10

Settings come as the worker's do (``--config``, ``STREAM_EXPORT_*``, ``--set``):
the broker, its security and ``worker.app_id`` (the groups topic's name). One line
per batch goes to stdout: ``batch <n> <ids>`` when taken and ``acked <n>`` once
acknowledged, and ``idle`` when ``--timeout`` passes without one.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stream_export.errors import FeedError
from stream_export.feed import Feed
from stream_export.rows.episode import prompt_text
from stream_export.settings import load


def grpo_batch(groups: list[Any]) -> dict[str, list[Any]]:
    """Closed groups as the columns of one GRPO step: a row per scored rollout."""
    batch: dict[str, list[Any]] = {"prompt": [], "completion": [], "reward": [], "advantage": []}
    for group in groups:
        for episode, advantage in zip(group.rollouts, group.advantages, strict=True):
            if advantage is None:  # left out of the group's statistics
                continue
            batch["prompt"].append(prompt_text(episode.prompt))
            batch["completion"].append(" ".join(s.content or "" for s in episode.steps))
            batch["reward"].append(episode.reward)
            batch["advantage"].append(advantage)
    return batch


def token_batch(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Token rows as TRL's async GRPO ``TrainingSequence`` fields."""
    return {
        "tokens": [r["input_ids"] for r in rows],
        "loss_mask": [r["loss_mask"] for r in rows],
        "old_log_probs": [r["logprobs"] for r in rows],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    parser.add_argument("--source", choices=["groups", "tokens"], default="groups")
    parser.add_argument("--group", default="trainer", help="the feed's consumer group")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--batches", type=int, default=0, help="stop after this many (0: never)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds to wait for a batch")
    args = parser.parse_args(argv)
    settings = load(file=args.config, overrides=args.set)
    with Feed(settings, args.source, group_id=args.group, batch_size=args.batch_size) as feed:
        for n in range(args.batches or sys.maxsize):
            try:
                batch = feed.next_batch(args.timeout)
            except FeedError:  # nothing within --timeout: caught up
                print("idle", flush=True)
                return 0
            if args.source == "groups":
                ids = [g.record_id for g in batch.items]
                shaped = grpo_batch(batch.items)
            else:
                ids = [f"{r['episode_id']}/{r['segment']}" for r in batch.items]
                shaped = token_batch(batch.items)
            print(f"batch {n} {' '.join(ids)}", flush=True)
            assert len({len(column) for column in shaped.values()}) <= 1  # aligned columns
            batch.ack()  # after the training step
            print(f"acked {n}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
