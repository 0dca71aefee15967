"""Partition folders on real files: Hive-style names that never meet the writer's own
files, an older layout's folder where a file of the writer goes, and the bounds on
open files and on the checkpoint with many distinct values."""

from __future__ import annotations

import importlib
import os
import resource
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from stream_export.output import card
from stream_export.output.layout import (
    checkpoint_path,
    manifest_path,
    own_names,
    read_checkpoint,
    read_manifest,
)
from stream_export.output.writer import Writer
from stream_export.runtime.metrics import Metrics
from stream_export.settings import Settings
from tests.support.sinkfiles import all_lines, record, sink_settings
from tests.support.writer_faults import Crash, FaultyOs, abandon, crash_mid_seal, resume_at


def counted(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(f"stream_export_{name}_total", labels)


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.fixture
def few_files() -> Iterator[int]:
    """The process may open 48 more files than it has open now (restored after)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limit = open_fds() + 48
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, hard))
    try:
        yield limit
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_values_that_name_the_writers_own_files_stay_in_their_folders(tmp_path: Path) -> None:
    w = Writer.open(
        sink_settings(tmp_path, partition_by="domain", rotate_records=1),
        worker_id="w",
        topic="t",
        metrics=Metrics(),
    )
    values = [*own_names("training-data"), "README.md", "training-data.manifest.jsonl"]
    for i, value in enumerate(values * 2):
        w.append(f"e{i}", [record(i)], partition=0, offset=i, event_time=0.0, folder=value)
    w.close()
    assert manifest_path(tmp_path, "training-data").is_file()
    assert checkpoint_path(tmp_path, "training-data").is_file()
    assert sorted(all_lines(tmp_path)) == sorted(record(i) for i in range(2 * len(values)))
    tops = {p.name for p in tmp_path.iterdir() if p.is_dir()}
    # hidden names are unsafe values: their records are in domain=_rejected
    assert tops == {f"domain={v}" for v in values if not v.startswith(".")} | {"domain=_rejected"}


def test_an_older_layouts_folder_where_the_manifest_goes_is_set_aside_losing_nothing(
    tmp_path: Path,
) -> None:
    """What the previous layout left for the value ``training-data.manifest.jsonl``:
    the folder where the manifest goes, holding an active file and a file whose seal
    the checkpoint names as pending (the seal failed on the folder). Every start
    failed on it; now the folder is renamed, the checkpoint follows, the seal ends."""
    settings = sink_settings(tmp_path, partition_by="domain")
    w = Writer.open(settings, worker_id="w", topic="t", metrics=Metrics())
    for i in range(4):
        w.append(f"e{i}", [record(i)], partition=0, offset=i, event_time=0.0, folder="x")
    crash_mid_seal(w, "domain=x")  # the next step failed on the folder
    old = "training-data.manifest.jsonl"
    (tmp_path / "domain=x").rename(tmp_path / old)
    ckpt = read_checkpoint(tmp_path, "training-data")
    assert ckpt is not None and ckpt.pending
    ckpt.moved("domain=x", old)
    checkpoint_path(tmp_path, "training-data").write_bytes(_encode(ckpt))

    metrics = Metrics()
    w = Writer.open(settings, worker_id="w", topic="t", metrics=metrics)
    w.append("e4", [record(4)], partition=0, offset=4, event_time=0.0, folder="x")
    w.close()
    [aside] = [p.name for p in tmp_path.iterdir() if p.name.startswith(f"{old}.misplaced-")]
    assert manifest_path(tmp_path, "training-data").is_file()
    [entry] = read_manifest(tmp_path, "training-data")
    assert entry.name.startswith(f"{aside}/") and entry.records == 4
    assert sorted(all_lines(tmp_path)) == sorted(record(i) for i in range(5))
    assert counted(metrics, "sink_errors", kind="misplaced") == 1


def _encode(ckpt: object) -> bytes:
    return msgspec.json.encode(ckpt)


@pytest.mark.parametrize("name", ["manifest", "checkpoint", "ids", "lock", "tmp"])
def test_a_folder_where_a_file_of_the_writer_goes_never_stops_a_start(
    tmp_path: Path, name: str
) -> None:
    path = {
        "manifest": manifest_path(tmp_path, "training-data"),
        "checkpoint": checkpoint_path(tmp_path, "training-data"),
        "ids": tmp_path / ".training-data.ids",
        "lock": tmp_path / ".training-data.lock",
        "tmp": tmp_path / "domain=x" / "training-data-1.jsonl.gz.tmp",
    }[name]
    (path / "inside").mkdir(parents=True)
    w = Writer.open(
        sink_settings(tmp_path, partition_by="domain", rotate_records=2),
        worker_id="w",
        topic="t",
        metrics=Metrics(),
    )
    for i in range(5):
        w.append(f"e{i}", [record(i)], partition=0, offset=i, event_time=0.0, folder="x")
    w.close()
    assert sorted(all_lines(tmp_path)) == sorted(record(i) for i in range(5))
    if name == "tmp":  # not the writer's: left alone
        assert (path / "inside").is_dir()
    else:
        assert path.is_file() or name == "lock"
        assert list(tmp_path.glob(f"{path.name}.misplaced-*/inside"))


def test_many_distinct_values_keep_open_files_and_the_checkpoint_bounded(
    tmp_path: Path, few_files: int
) -> None:
    """1,000 distinct values (and 12 that come back all the time) within 48 free
    descriptors: at most sink.max_open_files are open, the checkpoint names at most
    sink.max_active_files folders, and every record is in the files once."""
    metrics = Metrics()
    w = Writer.open(
        sink_settings(tmp_path, partition_by="domain", max_open_files=8, max_active_files=16),
        worker_id="w",
        topic="t",
        metrics=metrics,
    )
    before = open_fds()
    values = [f"v{i % 12}" for i in range(600)] + [f"d{i}" for i in range(1000)]
    most_open = most_active = 0
    for i, value in enumerate(values):
        w.append(f"e{i}", [record(i)], partition=0, offset=i, event_time=0.0, folder=value)
        if i % 7 == 0:
            w.flush()
            most_open = max(most_open, open_fds() - before)
            ckpt = read_checkpoint(tmp_path, "training-data")
            assert ckpt is not None
            most_active = max(most_active, len(ckpt.active))
    w.close()
    assert most_open <= 8 + 1 and most_active <= 16  # + the ids file
    assert Counter(all_lines(tmp_path)) == Counter(record(i) for i in range(len(values)))
    assert (counted(metrics, "files_rotated", reason="evicted") or 0) >= 1000 - 16


def produce_in_folders(w: Writer, start: int, total: int) -> None:
    """Like ``produce``, each record in folder ``v<i % 5>``."""
    for i in range(start, total):
        w.append(f"e{i}", [record(i)], partition=0, offset=i, event_time=0.0, folder=f"v{i % 5}")
        if i % 3 == 0:
            w.flush()
    w.flush()


def test_a_crash_at_any_file_system_call_while_evicting_loses_and_repeats_nothing(
    tmp_path: Path, faulty: Callable[..., FaultyOs]
) -> None:
    fields: dict[str, Any] = {
        "partition_by": "domain",
        "fsync": "flush",
        "max_open_files": 1,
        "max_active_files": 3,
    }

    def writer(out: Path) -> Writer:
        return Writer.open(
            sink_settings(out, **fields), worker_id="w", topic="t", metrics=Metrics()
        )

    w = writer(tmp_path / "count")
    fake = faulty(10**9)
    produce_in_folders(w, 0, 12)
    total = fake.calls
    w.close()
    assert total > 50
    for n in range(1, total + 1):
        out = tmp_path / f"crash-{n}"
        w = writer(out)
        fake = faulty(n)
        with pytest.raises(Crash):
            produce_in_folders(w, 0, 12)
        abandon(w)
        fake.times = 0
        w = writer(out)
        produce_in_folders(w, resume_at(w), 12)
        w.close()
        got = Counter(all_lines(out))
        assert got == Counter(record(i) for i in range(12)), f"crash at call {n}"
        names = [e.name for e in read_manifest(out, "training-data")]
        assert len(names) == len(set(names)), f"crash at call {n}"


def test_datasets_loads_the_sealed_files_of_every_folder_through_the_card(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``datasets.load_dataset(<output_dir>)`` over ``domain=a/`` and ``domain=b/``:
    the sealed records, the card's columns (no column from the folder names)."""
    for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
        monkeypatch.setenv(name, "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    datasets = importlib.import_module("datasets")
    out = tmp_path / "out"
    settings = msgspec.convert(
        {"sink": {"output_dir": str(out), "partition_by": "domain", "rotate_records": 2}},
        Settings,
    )
    w = Writer.open(settings.sink, worker_id="w", topic="t", metrics=Metrics())
    for i in range(8):
        line = msgspec.json.encode({"prompt": f"p{i}", "completion": "c"})
        w.append(f"e{i}", [line], partition=0, offset=i, event_time=0.0, folder="ab"[i % 2])
    w.close()
    card.write(settings)
    got = datasets.load_dataset(str(out), split="train", cache_dir=str(tmp_path / "cache"))
    assert got.column_names == ["prompt", "completion"]
    assert sorted(got["prompt"]) == ["p0", "p1", "p2", "p3"]  # the sealed ones
