"""The token plane's benchmark (issue 26, item 5), in one command (never in CI).

    python -m bench.tokens [--quick] [--bootstrap HOST:PORT] [--episodes 2000] [--rounds 3]

Generates bench.token_load's llm_call episodes (seeded: 2-8 calls, prompts of
1,000-4,096 tokens sent as deltas, completions of 100-1,000 tokens, float32
logprobs), produces them once to a fresh 4-partition steps topic (and once per
worker run to a topic of its own: the worker writes control ticks to its steps
topic), then runs in alternating rounds, each system in its own process and
consumer group:

  A  kcat reading the topic to a file
  B  bench/raw_tokens.py: a hand-written aiokafka pipeline (not the project's
     code) that decodes the calls, rebuilds the sequences and appends the rows
  C  the real worker, `stream-export worker` with format.format=tokens

Then a new worker gets episodes at half its median rate for the end-to-end
latency, and bench.open_episodes holds 10,000 token episodes open (a start and
3 calls each) for the peak RSS. Reports tokens/s and MB/s (min/median/max), the
ratios per round and the bars to bench/results/<date>-tokens.md and .json.
Without --bootstrap it starts a broker of its own (dev/kafka) and stops it at
the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from functools import partial
from typing import Final

from bench import open_episodes
from bench.harness import Harness, defaults, on_broker, parser, rounds_heading
from bench.progress import Progress
from bench.raw_tokens import FETCH_BYTES
from bench.report import Results
from bench.runs import KCAT, RAW, WORKER, Latency, Run
from bench.systems import Handle, Kcat, RawTokens, RealWorker
from bench.token_load import TokenLoad, generate
from bench.token_report import (
    SYSTEMS,
    OpenEpisodes,
    TokenLoadFigures,
    TokenReport,
    markdown,
    rates,
    to_json,
)
from tests.support.traffic import Plan

TOKENS: Final = ("format.format=tokens",)
QUICK: Final = {"episodes": 200, "rounds": 1, "latency_seconds": 8.0, "open_episodes": 1000}
DEFAULTS: Final = {"episodes": 2000, "rounds": 3, "latency_seconds": 30.0, "open_episodes": 10_000}
OPEN_CALLS: Final = 3
PROG: Final = "python -m bench.tokens"
_EPISODE_ID: Final = b'"episode_id": "'


def parse(argv: list[str]) -> argparse.Namespace:
    quick = (
        "{episodes:,} episodes, {rounds} round, {latency_seconds:.0f} s of latency, "
        "{open_episodes:,} open episodes"
    )
    p = parser(PROG, __doc__, quick.format(**QUICK), DEFAULTS)
    p.add_argument("--episodes", type=int, help=f"episodes in the topic ({DEFAULTS['episodes']:,})")
    p.add_argument(
        "--open-episodes",
        type=int,
        help=f"open token episodes for the peak RSS (0: none; {DEFAULTS['open_episodes']:,})",
    )
    p.add_argument(
        "--raw-fetch-bytes",
        type=int,
        default=FETCH_BYTES,
        help=f"the raw pipeline's max_partition_fetch_bytes ({FETCH_BYTES:,}, aiokafka's default)",
    )
    p.add_argument("--timeout", type=float, help="seconds one run may take (120 + episodes/5)")
    args = p.parse_args(argv)
    defaults(args, QUICK, DEFAULTS)
    args.timeout = args.timeout or 120 + args.episodes / 5
    return args


def episode_of(row: bytes) -> str:
    """A tokens row's episode id, found without decoding its arrays (on two shared
    cores, decoding every row in the bench's process slows the worker it watches):
    the arrays hold only numbers, so the first ``"episode_id": "`` is the column."""
    start = row.index(_EPISODE_ID) + len(_EPISODE_ID)
    return row[start : row.index(b'"', start)].decode()


def _plan(load: TokenLoad) -> Plan:
    return Plan(messages=load.messages, ended=dict(load.ended))


class TokenBench(Harness):
    def __init__(self, args: argparse.Namespace, bootstrap: str, progress: Progress) -> None:
        super().__init__(args, bootstrap, progress)
        self.notes.append(
            f"the raw pipeline fetches up to {args.raw_fetch_bytes:,} bytes a partition "
            "(max_partition_fetch_bytes; the worker's consumers 1,048,576)"
        )

    def starters(self, topic: str, load: TokenLoad, r: int) -> dict[str, Callable[[], Handle]]:
        d = self.workdir

        def kcat() -> Handle:
            return Kcat(self.bootstrap, topic, d / "kcat.out", len(load.messages))

        def raw() -> Handle:
            group = f"bench-{self.token}-raw-{r}"
            out, log = d / f"raw-{r}.jsonl", d / f"raw-{r}.log"
            fetch = self.args.raw_fetch_bytes
            return RawTokens(self.bootstrap, topic, group, out, log, load.rows, fetch)

        def worker() -> Handle:
            steps = f"topics.steps={topic}-worker-{r}"
            s = self.settings(self.token, f"worker-{r}", steps, *TOKENS)
            return RealWorker(s, d / f"worker-{r}.log", load.rows)

        return {KCAT: kcat, RAW: raw, WORKER: worker}

    def throughput(self) -> tuple[TokenLoadFigures, list[Run]]:
        """Produce the load (once shared, once per worker run), then run the rounds."""
        args = self.args
        self.progress.step("producing the load")
        load = generate(args.episodes, seed=26, now=time.time())
        base = self.copies(load.messages, shared=bool(args.rounds))  # --rounds 0: latency only
        figures = TokenLoadFigures(
            episodes=load.episodes,
            messages=len(load.messages),
            calls=load.calls,
            deltas=load.deltas,
            rows=load.rows,
            tokens=load.tokens,
            bytes=load.bytes,
            partitions=base.topics.partitions,
        )

        def done(run: Run) -> str:
            tokens, mb = rates(figures, run)
            return f"{mb:7.1f} MB/s {tokens:11,.0f} tokens/s {run.peak_rss_mb:6.0f} MB RSS"

        starters = partial(self.starters, base.topics.steps, load)
        return figures, self.rounds(starters, figures.messages, done)

    def latency_run(self, runs: list[Run], per_episode: float) -> Latency | None:
        def plans(episodes: int) -> tuple[Plan, Plan]:
            warmup = _plan(generate(1, seed=28, now=time.time()))
            return warmup, _plan(generate(episodes, seed=27, now=time.time()))

        return self.latency(runs, per_episode, plans, TOKENS, "messages", episode_of)

    def open_episodes(self) -> OpenEpisodes | None:
        n = self.args.open_episodes
        if not n:
            return None
        self.progress.step(f"{n:,} open token episodes")
        got = open_episodes.run(self.bootstrap, n, self.workdir / "open", calls=OPEN_CALLS)
        return OpenEpisodes(episodes=n, calls=OPEN_CALLS, **got)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    now = datetime.now(UTC)
    steps = 1 + args.rounds * len(SYSTEMS) + bool(args.latency_seconds) + bool(args.open_episodes)
    progress = Progress(steps)

    Outcome = tuple[TokenBench, TokenLoadFigures, list[Run], Latency | None, OpenEpisodes | None]

    def body(bootstrap: str) -> Outcome:
        bench = TokenBench(args, bootstrap, progress)
        load, runs = bench.throughput()
        latency = bench.latency_run(runs, load.messages / load.episodes)
        return bench, load, runs, latency, bench.open_episodes()

    done = on_broker(PROG, args, progress, body)
    if done is None:
        return 1
    (bench, load, runs, latency, opened), where = done
    report = TokenReport(
        **rounds_heading(PROG, argv, args, now, where),
        load=load,
        runs=runs,
        latency=latency,
        open_episodes=opened,
        notes=bench.notes,
    )
    Results(args.results, now, "tokens", quick=args.quick).write(markdown(report), to_json(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
