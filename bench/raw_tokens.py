"""What a user would write instead of the worker for token rows: one aiokafka
getmany loop that decodes the calls, rebuilds each episode's token sequences and
appends ``tokens`` rows to a file (the token-plane benchmark's baseline).

    python -m bench.raw_tokens OUT.jsonl --bootstrap HOST:PORT --topic T --group G [--fetch-bytes N]

Written without the project's code (the loop is bench/getmany.py's, plain
aiokafka): msgspec structs that decode only the fields it needs (the request and
response messages are skipped), the episodes under way in a dict, an episode's
rows built when its end and all its steps are there, the lines appended to OUT
and the offsets committed after each fetch. No durability (an episode under way
is lost with the process, nothing is fsynced), no dead letters, no bounds, no
late or duplicate handling beyond "a seq once": the floor of what the job costs
in Python. Runs until stopped.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import msgspec
from aiokafka import AIOKafkaConsumer

from bench.getmany import lines_to_file

Row = dict[str, Any]
#: aiokafka's default max_partition_fetch_bytes, as a user leaves it (and as the
#: worker's consumers fetch).
FETCH_BYTES: Final = 1024 * 1024


class Call(msgspec.Struct):
    prompt_token_ids: list[int]
    completion_token_ids: list[int]
    logprobs: list[float]
    weight_version: int | str
    prompt_base: int | None = None


class Event(msgspec.Struct):
    type: str
    episode_id: str
    seq: int = -1
    call: Call | None = None
    steps: int = -1
    outcome: str | None = None
    reward: float | None = None
    group_id: str | None = None


class Open:
    __slots__ = ("calls", "end")

    def __init__(self) -> None:
        self.calls: dict[int, Call | None] = {}
        self.end: Event | None = None


_decode = msgspec.json.Decoder(Event).decode
_encoder = msgspec.json.Encoder()


def _encode(row: Row) -> bytes:
    """One line spelled as ``json.dumps`` spells it (", " and ": "), as the worker does."""
    return msgspec.json.format(_encoder.encode(row), indent=0)


def _version_key(v: int | str) -> tuple[int, int, str]:
    if isinstance(v, int):
        return (0, v, "")
    return (0, int(v), "") if v.lstrip("-").isdigit() else (1, 0, v)


def rows(eid: str, calls: list[tuple[int, Call]], end: Event) -> list[Row]:
    """The ``tokens`` rows of an episode's (seq, call)s in seq order: a call whose
    full prompt starts with the previous call's prompt + completion extends its row."""
    out: list[Row] = []
    done: dict[int, list[int]] = {}  # seq -> that call's prompt + completion
    ids: list[int] = []
    mask: list[int] = []
    lps: list[float] = []
    versions: list[int | str] = []
    starts: list[int] = []
    ends: list[int] = []
    prompt_len = 0

    def close() -> None:
        out.append(
            {
                "input_ids": ids,
                "loss_mask": mask,
                "logprobs": lps,
                "prompt_len": prompt_len,
                "weight_version_min": min(versions, key=_version_key),
                "weight_version_max": max(versions, key=_version_key),
                "call_starts": starts,
                "call_ends": ends,
                "call_weight_versions": (
                    [str(v) for v in versions] if len({type(v) for v in versions}) > 1 else versions
                ),
                "episode_id": eid,
                "segment": len(out),
                "reward": end.reward,
                "outcome": end.outcome,
                "group_id": end.group_id or "",
            }
        )

    for seq, call in calls:
        if call.prompt_base is None:
            prompt = call.prompt_token_ids
        else:
            prompt = done[call.prompt_base] + call.prompt_token_ids
        if not done or prompt[: len(ids)] != ids:
            if done:
                close()
            ids, mask, lps, versions, starts, ends = [], [], [], [], [], []
            prompt_len = len(prompt)
        added = len(prompt) - len(ids)
        ids = prompt + call.completion_token_ids
        mask += [0] * added + [1] * len(call.completion_token_ids)
        lps += [0.0] * added + call.logprobs
        versions.append(call.weight_version)
        starts.append(len(prompt))
        ends.append(len(ids))
        done[seq] = ids
    if done:
        close()
    return out


def take(episodes: dict[str, Open], value: bytes) -> list[bytes]:
    """One message in; the lines of the episode it completes, if it does."""
    event = _decode(value)
    ep = episodes.get(event.episode_id)
    if ep is None:
        ep = episodes[event.episode_id] = Open()
    if event.type == "step":
        ep.calls.setdefault(event.seq, event.call)
    elif event.type == "end":
        ep.end = event
    end = ep.end
    if end is None or len(ep.calls) < end.steps:
        return []
    del episodes[event.episode_id]
    calls = [(s, c) for s in range(end.steps) if (c := ep.calls[s]) is not None]
    made = rows(event.episode_id, calls, end)
    return [_encode(r) for r in made]


async def run(bootstrap: str, topic: str, group: str, out: Path, fetch_bytes: int) -> None:
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        max_partition_fetch_bytes=fetch_bytes,
    )
    episodes: dict[str, Open] = {}

    def lines_of(partition: int, records: Sequence[Any]) -> list[bytes]:
        lines: list[bytes] = []
        for record in records:
            if record.value:  # not a tombstone, nor a worker's control tick (empty)
                lines += take(episodes, record.value)
        return lines

    await lines_to_file(consumer, out, lines_of)


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.raw_tokens", description=__doc__)
    p.add_argument("out", type=Path)
    p.add_argument("--bootstrap", required=True)
    p.add_argument("--topic", required=True)
    p.add_argument("--group", required=True)
    p.add_argument(
        "--fetch-bytes",
        type=int,
        default=FETCH_BYTES,
        help=f"max_partition_fetch_bytes (aiokafka's default, {FETCH_BYTES:,})",
    )
    args = p.parse_args()
    asyncio.run(run(args.bootstrap, args.topic, args.group, args.out, args.fetch_bytes))


if __name__ == "__main__":
    main()
