"""Partition folders in the real worker: values that name the writer's own files,
1,000 distinct values under a 1,024 open-file limit, and restarts with a bad entry
already in the output folder. The worker stays up and writes every record once."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from stream_export.output.follow import Follower
from stream_export.output.layout import manifest_path, read_checkpoint
from stream_export.settings import Settings
from tests.support.monitoring import free_port, get, get_json
from tests.support.processes import Worker
from tests.support.sinkkafka import episode, message, prompts, publish
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

#: The worker's own limit of open files, as on many hosts.
ONE_K_FILES = (
    "import resource\n"
    "resource.setrlimit(resource.RLIMIT_NOFILE, "
    "(1024, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))"
)


def http_on(port: int) -> tuple[str, ...]:
    return ("http.enabled=true", f"http.port={port}")


def records(out: Path) -> int:
    """Records the follow reader reads (none while a folder stands where the manifest
    goes: the worker sets it aside as it starts)."""
    if manifest_path(out, "training-data").is_dir():
        return 0
    return len(list(Follower(out, wait=False)))


def served(url: str) -> bool:
    """/status.json answers and reads the output folder without trouble."""
    status = get_json(f"{url}/status.json")
    return bool(status) and status.get("output_error") is None


def plant(out: Path, name: str) -> Path:
    """A folder (with a file in it) where a file of the writer goes."""
    (out / name).mkdir(parents=True)
    (out / name / "kept.txt").write_text("an operator's file\n")
    return out / name


def test_values_naming_the_writers_files_and_folders_in_their_place_never_stop_it(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    port = free_port()
    settings = settings_for(
        "sink.partition_by=domain", "sink.rotate_records=3", "format.format=episode", *http_on(port)
    )
    url, out = f"http://127.0.0.1:{port}", Path(settings.sink.output_dir)
    plant(out, "training-data.manifest.jsonl")  # as the previous layout left it
    domains = ["training-data.manifest.jsonl", "README.md", ".training-data.ids", "math"]
    publish(settings, [message(episode(i, metadata={"domain": domains[i % 4]})) for i in range(24)])
    with Worker(settings, tmp_path / "w1.log") as worker:
        wait_for(
            lambda: records(out) == 24 and served(url),
            timeout=90,
            what=f"24 records, /status.json\n{worker.log()[-3000:]}",
        )
        assert worker.alive()
    assert worker.stop() == 0
    assert manifest_path(out, "training-data").is_file()
    [aside] = out.glob("training-data.manifest.jsonl.misplaced-*")
    assert (aside / "kept.txt").read_text() == "an operator's file\n"
    folders = {p.name for p in out.iterdir() if p.is_dir() and "=" in p.name}
    assert folders == {
        "domain=training-data.manifest.jsonl",
        "domain=README.md",
        "domain=_rejected",  # a hidden name is not a safe value
        "domain=math",
    }

    # A restart with more bad entries already in the folder, one the checkpoint's
    # temporary name: the worker starts, sets them aside and writes on.
    for name in (".training-data.checkpoint.json.tmp", ".training-data.uploaded"):
        plant(out, name)
    publish(settings, [message(episode(i, metadata={"domain": "math"})) for i in range(24, 30)])
    with Worker(settings, tmp_path / "w2.log") as worker:
        wait_for(
            lambda: records(out) == 30 and served(url),
            timeout=90,
            what=f"30 records\n{worker.log()[-3000:]}",
        )
    assert worker.stop() == 0
    assert len(list(out.glob(".training-data.checkpoint.json.tmp.misplaced-*/kept.txt"))) == 1
    assert len(list(out.glob(".training-data.uploaded.misplaced-*/kept.txt"))) == 1


def open_fds(url: str) -> float | None:
    status, body = get(f"{url}/metrics")
    found = re.search(r"^process_open_fds (\S+)$", body.decode(), flags=re.M)
    return float(found[1]) if status == 200 and found else None


def test_a_thousand_distinct_values_within_1024_open_files_and_a_restart(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """The default table store (RocksDB), as the worker runs. Before: every value kept
    a file open until rotation, EMFILE ended the worker (the status thread's), again
    after every restart."""
    port = free_port()
    settings = settings_for("sink.partition_by=domain", "worker.store=rocksdb://", *http_on(port))
    url, out = f"http://127.0.0.1:{port}", Path(settings.sink.output_dir)
    publish(settings, [message(episode(i, metadata={"domain": f"d{i}"})) for i in range(1000)])
    most = 0.0

    def all_written(total: int) -> bool:
        nonlocal most
        most = max(most, open_fds(url) or 0.0)
        return sum(prompts(out).values()) == total and served(url)

    with Worker(settings, tmp_path / "w1.log", prelude=ONE_K_FILES) as worker:
        wait_for(lambda: all_written(1000), timeout=120, what=f"1,000 records\n{worker.log()}")
        ckpt = read_checkpoint(out, "training-data")
        assert ckpt is not None and len(ckpt.active) <= settings.sink.max_active_files
        assert most < 512, most  # the worker's own, and at most max_open_files of ours
    assert worker.stop() == 0

    plant(out, "training-data.manifest.jsonl.tmp")
    publish(
        settings, [message(episode(i, metadata={"domain": f"e{i}"})) for i in range(1000, 1300)]
    )
    with Worker(settings, tmp_path / "w2.log", prelude=ONE_K_FILES) as worker:
        wait_for(lambda: all_written(1300), timeout=120, what=f"1,300 records\n{worker.log()}")
    assert worker.stop() == 0
    assert prompts(out) == Counter(f"task {i}" for i in range(1300))
