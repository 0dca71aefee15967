"""Writer micro-benchmark: one-kilobyte records through Writer.append + tick.

Run: ``python -m bench.bench_writer [--records N] [--fsync rotation] [--runs 3]``.
Uses the default settings (flush every 200 ms, fsync at rotation, rotation at
256 MiB, so one million records include sealing: fsync, rename, manifest) and
prints records/s per run, the median and the ratio to the 200,000/s target, next
to the same bytes written raw (``os.write`` in 20 MiB chunks, no fsync) on the
same file system as the ceiling this machine allows.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import msgspec

from stream_export.output.writer import Writer
from stream_export.runtime.metrics import Metrics
from stream_export.settings.sink import SinkSettings

TARGET = 200_000


def run(records: int, fsync: str, out: str) -> float:
    settings = msgspec.convert({"output_dir": out, "fsync": fsync}, SinkSettings)
    writer = Writer.open(settings, worker_id="bench", topic="bench", metrics=Metrics())
    line = msgspec.json.encode({"prompt": "p" * 480, "completion": "c" * 500})[:1023]
    ids = [f"episode-{i}" for i in range(records)]
    started = time.perf_counter()
    for i, episode_id in enumerate(ids):
        writer.append(episode_id, [line], partition=i & 3, offset=i >> 2, event_time=0.0)
        if i & 1023 == 0:
            writer.tick()
    writer.flush()
    elapsed = time.perf_counter() - started
    writer.close()
    return records / elapsed


def raw(records: int, out: str) -> float:
    """Records/s of plain 20 MiB writes of the same bytes: the file-system ceiling."""
    chunk = b"x" * (20 << 20)
    started = time.perf_counter()
    with open(os.path.join(out, "raw"), "wb", buffering=0) as fh:
        for _ in range(records * 1024 // len(chunk)):
            fh.write(chunk)
    return records / (time.perf_counter() - started)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--records", type=int, default=1_000_000)
    p.add_argument("--fsync", default="rotation", choices=["flush", "rotation", "never"])
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    rates, ceilings = [], []
    for n in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="bench-writer-") as out:
            rates.append(run(args.records, args.fsync, out))
        with tempfile.TemporaryDirectory(prefix="bench-writer-") as out:
            ceilings.append(raw(args.records, out))
        print(
            f"run {n + 1}: writer {rates[-1]:,.0f} records/s ({rates[-1] / 1024:,.0f} MiB/s), "
            f"raw writes {ceilings[-1]:,.0f} records/s"
        )
    rate, ceiling = statistics.median(rates), statistics.median(ceilings)
    print(
        f"writer: {args.records:,} records of 1 KiB, fsync={args.fsync}, default flush and "
        f"rotation: median {rate:,.0f} records/s, {rate / TARGET:.2f}x the {TARGET:,}/s target, "
        f"{rate / ceiling:.2f}x raw writes ({ceiling:,.0f}/s)"
    )


if __name__ == "__main__":
    main()
