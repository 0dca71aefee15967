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
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from bench import token_load
from bench.bench_formats import episode_bytes
from bench.harness import RESULTS, write_results
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


def spread(values: list[float]) -> str:
    return f"{min(values):.3g} / {statistics.median(values):.3g} / {max(values):.3g}"


def run(rounds: int, episodes: int, workdir: Path) -> tuple[list[str], dict[str, Any]]:
    """The Markdown table, and every round's figures per workload and encoding."""
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
    table = [
        "| records | encoding | bytes on disk | bytes vs jsonl "
        "| CPU µs per record (min / median / max) | datasets load s (min / median / max) |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    data: dict[str, Any] = {}
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
            e: {"records": len(lines), "bytes": size[e], "cpu_us": cpu[e], "load_s": loads[e]}
            for e in ENCODINGS
        }
        for encoding in ENCODINGS:
            ratio = size[encoding] / size["jsonl"]
            table.append(
                f"| {name} ({len(lines):,}) | {encoding} | {size[encoding]:,} | {ratio:.2f} | "
                f"{spread(cpu[encoding])} | {spread(loads[encoding])} |"
            )
    return table, data


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--episodes", type=int, default=400, help="token episodes (text: 5x)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--results", type=Path, default=RESULTS)
    args = p.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="bench-parquet-") as tmp:
        table, data = run(args.rounds, args.episodes, Path(tmp))
    now = datetime.now(UTC)
    stamp = now.strftime("%Y-%m-%dT%H%MZ")
    body = "\n".join(
        [
            "# Parquet against JSON lines (`python -m bench.parquet`)",
            "",
            f"{stamp}, {args.rounds} rounds, encodings alternating in order; "
            f"{os.cpu_count()} cores, shared machine.",
            "",
            *table,
            "",
            "CPU: the Writer appending every record and sealing one file (JSON lines "
            "written, then compressed or transcoded at the seal), user+system time of "
            "this process per record. Load: `datasets.load_dataset` of the sealed file "
            "into a fresh cache.",
        ]
    )
    write_results(args.results, now, "parquet", body + "\n", json.dumps(data, indent=1).encode())


if __name__ == "__main__":
    main()
