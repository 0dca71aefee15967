"""Parquet against JSON lines on the same records (issue 29): bytes on disk, the
sink's CPU per record, and the time ``datasets`` takes to load the files.

    python -m bench.parquet [--episodes 400] [--rounds 5] [--results DIR]

Records: the ``tokens`` rows of ``bench.token_load``'s model-call episodes (2-8
calls, prompts of 1-4k tokens, float32 logprobs) and the ``conversational``
records of the demo's text episodes. Per round and encoding the real Writer
appends every record and seals one file (rotation off), as the sink does: CPU is
the process's user+system time for that, per record. Then a fresh ``datasets``
cache loads the sealed file (``json`` or ``parquet`` builder). Encodings run in
alternating order each round; figures are min / median / max over the rounds.
"""

from __future__ import annotations

import argparse
import importlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import msgspec

from bench import token_load
from bench.bench_formats import episode_bytes
from bench.report import (
    Heading,
    Results,
    cells,
    heading,
    num,
    page,
    results_json,
    results_option,
    row,
    spread,
    title,
)
from stream_export.assemble.tokens import token_plane
from stream_export.contract.decoding import decode_episode, decode_event
from stream_export.contract.episode import Episode
from stream_export.contract.events import EpisodeEnd, Step
from stream_export.output import formatter
from stream_export.output.layout import read_manifest
from stream_export.output.writer import Writer
from stream_export.rows import schema
from stream_export.runtime.metrics import Metrics
from stream_export.settings.format import FormatSettings
from stream_export.settings.sink import SinkSettings

PROG: Final = "python -m bench.parquet"
ENCODINGS: Final = {
    "jsonl": {},
    "jsonl+zstd": {"compression": "zstd"},
    "parquet (zstd)": {"encoding": "parquet"},
}


def token_records(episodes: int) -> list[bytes]:
    """The tokens rows of the token load's episodes, put together by the worker's
    own token plane."""
    load = token_load.generate(episodes, seed=29, now=1.8e9)
    steps: dict[bytes, list[Step]] = {}
    fmt = formatter.build(FormatSettings(format="tokens", metadata_mode="columns"), Metrics())
    lines = []
    for key, value in load.messages:
        event = decode_event(value, max_bytes=1 << 24)
        if isinstance(event, Step):
            steps.setdefault(key, []).append(event)
        elif isinstance(event, EpisodeEnd):
            plane = token_plane(steps.pop(key))
            assert plane is not None
            episode = Episode(
                episode_id=key.decode(),
                agent_id="bench",
                prompt="",
                steps=plane.steps,
                start_time=event.time - 10,
                end_time=event.time,
                outcome="success",
                reward=1.0,
                tokens=plane.tokens,
            )
            lines += fmt(episode)
    return lines


def text_records(episodes: int) -> list[bytes]:
    fmt = formatter.build(
        FormatSettings(format="conversational", metadata_mode="columns"), Metrics()
    )
    encoded, _, _ = episode_bytes(episodes, seed=29)
    return [line for value in encoded for line in fmt(decode_episode(value))]


def write(out: Path, lines: list[bytes], columns: Any, **sink: Any) -> tuple[float, int]:
    """CPU seconds to append and seal ``lines``, and the sealed file's bytes."""
    settings = SinkSettings(output_dir=str(out), rotate_bytes=0, fsync="never", **sink)
    started = time.process_time()
    writer = Writer.open(settings, worker_id="b", topic="t", metrics=Metrics(), columns=columns)
    for i, line in enumerate(lines):
        writer.append(f"r{i}", [line], partition=0, offset=i, event_time=0.0)
    writer.seal_all()
    writer.close()
    cpu = time.process_time() - started
    [entry] = read_manifest(out, "training-data")
    return cpu, entry.bytes


def load_seconds(out: Path, builder: str) -> float:
    datasets = importlib.import_module("datasets")

    files = [str(out / e.name) for e in read_manifest(out, "training-data")]
    cache = tempfile.mkdtemp(prefix="hf-")
    try:
        started = time.perf_counter()
        datasets.load_dataset(builder, data_files=files, split="train", cache_dir=cache)
        return time.perf_counter() - started
    finally:
        shutil.rmtree(cache)


class Encoded(msgspec.Struct, kw_only=True):
    """One encoding of one workload's records over the rounds."""

    records: int
    bytes: int
    cpu_us: list[float]
    load_s: list[float]


class ParquetReport(Heading, kw_only=True):
    rounds: int
    #: Workload -> encoding -> its figures.
    workloads: dict[str, dict[str, Encoded]]


def run(rounds: int, episodes: int, workdir: Path) -> dict[str, dict[str, Encoded]]:
    """Every round's figures per workload and encoding."""
    workloads: dict[str, tuple[list[bytes], Callable[[], Any]]] = {
        "tokens": (
            token_records(episodes),
            lambda: schema.episode_schema(FormatSettings(format="tokens", metadata_mode="columns")),
        ),
        "conversational": (
            text_records(episodes * 5),
            lambda: schema.episode_schema(
                FormatSettings(format="conversational", metadata_mode="columns")
            ),
        ),
    }
    data: dict[str, dict[str, Encoded]] = {}
    for name, (lines, columns) in workloads.items():
        cpu: dict[str, list[float]] = {e: [] for e in ENCODINGS}
        loads: dict[str, list[float]] = {e: [] for e in ENCODINGS}
        size: dict[str, int] = {}
        order = list(ENCODINGS)
        for r in range(rounds):
            for encoding in order if r % 2 == 0 else order[::-1]:
                out = workdir / f"{name}-{r}-{encoding.split()[0]}"
                seconds, size[encoding] = write(out, lines, columns(), **ENCODINGS[encoding])
                cpu[encoding].append(seconds / len(lines) * 1e6)
                builder = "parquet" if "parquet" in encoding else "json"
                loads[encoding].append(load_seconds(out, builder))
                shutil.rmtree(out)
        data[name] = {
            e: Encoded(records=len(lines), bytes=size[e], cpu_us=cpu[e], load_s=loads[e])
            for e in ENCODINGS
        }
    return data


def markdown(report: ParquetReport) -> str:
    lines = [
        *title("Parquet against JSON lines", report),
        "",
        f"{report.rounds} rounds, encodings alternating in order; shared machine.",
        "",
        row(
            "records",
            "encoding",
            "bytes on disk",
            "bytes vs jsonl",
            "CPU µs per record (min / median / max)",
            "datasets load s (min / median / max)",
        ),
        row("---", "---", "---", "---", "---", "---"),
    ]
    for name, encoded in report.workloads.items():
        for encoding, e in encoded.items():
            lines.append(
                row(
                    f"{name} ({e.records:,})",
                    encoding,
                    f"{e.bytes:,}",
                    num(e.bytes / encoded["jsonl"].bytes),
                    cells(spread(e.cpu_us)),
                    cells(spread(e.load_s)),
                )
            )
    lines += [
        "",
        "CPU: the Writer appending every record and sealing one file (JSON lines "
        "written, then compressed or transcoded at the seal), user+system time of "
        "this process per record. Load: `datasets.load_dataset` of the sealed file "
        "into a fresh cache.",
    ]
    return page(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--episodes", type=int, default=400, help="token episodes (text: 5x)")
    p.add_argument("--rounds", type=int, default=5)
    results_option(p)
    args = p.parse_args(argv)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    now = datetime.now(UTC)
    with tempfile.TemporaryDirectory(prefix="bench-parquet-") as tmp:
        workloads = run(args.rounds, args.episodes, Path(tmp))
    report = ParquetReport(**heading(PROG, argv, now), rounds=args.rounds, workloads=workloads)
    Results(args.results, now, "parquet").write(markdown(report), results_json(report))


if __name__ == "__main__":
    main()
