"""`stream-export export` replays the episodes topic into a file or a rotated set."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from stream_export.config import Settings
from stream_export.layout import read_manifest
from tests.support.processes import settings_args
from tests.support.sinkkafka import episode, message, prompts, publish

pytestmark = pytest.mark.integration

DAY = 86_400.0
T0 = 1_700_000_000.0


def export(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stream_export", "export", *settings_args(settings), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def published(settings_for: Callable[..., Settings]) -> Settings:
    """300 episodes one day apart from T0, a repeat and a bad message."""
    settings = settings_for("sink.rotate_records=40")
    messages = [message(episode(i, end_time=T0 + i * DAY)) for i in range(300)]
    publish(settings, [*messages, messages[5], (b"bad", b"{")])
    return settings


def test_export_to_a_file_writes_every_episode_once_with_a_progress_bar(
    published: Settings, tmp_path: Path
) -> None:
    target = tmp_path / "all.jsonl"
    done = export(published, "--to", str(target))
    assert done.returncode == 0, done.stderr
    records = [json.loads(line) for line in target.read_text().splitlines()]
    assert Counter(r["prompt"] for r in records) == Counter(f"task {i}" for i in range(300))
    assert "100%" in done.stderr and "302/302 messages" in done.stderr
    assert "300 records from 300 episodes" in done.stderr and "1 repeated, 1 invalid" in done.stderr
    assert not list(tmp_path.glob("*.partial"))


def test_export_time_range_and_format(published: Settings, tmp_path: Path) -> None:
    target = tmp_path / "range.jsonl"
    since, until = "2023-11-24T22:13:20+00:00", str(T0 + 20 * DAY)  # days 10..19
    done = export(published, "--to", str(target), "--since", since, "--until", until)
    assert done.returncode == 0, done.stderr
    got = Counter(json.loads(line)["prompt"] for line in target.read_text().splitlines())
    assert got == Counter(f"task {i}" for i in range(10, 20))
    bad = export(published, "--to", str(target), "--since", "yesterday")
    assert bad.returncode == 2 and "not a time" in bad.stderr


def test_export_to_a_directory_writes_a_rotated_set_with_a_manifest(
    published: Settings, tmp_path: Path
) -> None:
    target = tmp_path / "set"
    done = export(published, "--to", f"{target}/", "--quiet")
    assert done.returncode == 0, done.stderr
    assert "export [" not in done.stderr, done.stderr
    entries = read_manifest(target, "training-data")
    assert [e.records for e in entries] == [40] * 7 + [20], done.stderr
    assert not (target / "training-data.jsonl").exists()
    assert prompts(target) == Counter(f"task {i}" for i in range(300))
    again = export(published, "--to", f"{target}/")
    assert again.returncode == 2 and "not empty" in again.stderr
