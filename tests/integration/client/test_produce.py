"""`stream-export produce` on a real broker: sends a JSONL file, reports a planted bad
line by its number, and never drops anything after it silently."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from stream_export.contract.decoding import decode_event, encode
from stream_export.kafka import topics
from stream_export.ops import demo
from stream_export.settings import Settings
from tests.support.processes import settings_args
from tests.support.topic_reader import read_topic

pytestmark = pytest.mark.integration

BAD_LINE = 7
BAD = b'{"type": "step", "v": 1, "episode_id": "x", "time": 1, "seq": "seven", "kind": "thought"}'


@pytest.mark.parametrize(
    ("on_error", "source"), [("skip", "file"), ("stop", "file"), ("skip", "stdin")]
)
def test_produce_sends_a_file_and_reports_a_planted_bad_line(
    settings_for: Callable[..., Settings], tmp_path: Path, on_error: str, source: str
) -> None:
    settings = settings_for()
    asyncio.run(topics.apply(settings))
    good = [encode(e) for episode in itertools.islice(demo.episodes(seed=11), 3) for e in episode]
    lines = [*good[: BAD_LINE - 1], BAD, *good[BAD_LINE - 1 :]]
    path = tmp_path / "events.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")

    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "stream_export",
            "produce",
            "-" if source == "stdin" else str(path),
            "--on-error",
            on_error,
            *settings_args(settings),
        ],
        input=path.read_bytes() if source == "stdin" else None,
        capture_output=True,
        timeout=120,
    )
    stderr = done.stderr.decode()
    assert done.returncode == 1, stderr
    name = "<stdin>" if source == "stdin" else str(path)
    assert f"{name}:{BAD_LINE}: invalid:" in stderr
    assert "$.seq" in stderr

    expected = good if on_error == "skip" else good[: BAD_LINE - 1]
    if on_error == "stop":
        assert f"stopped at line {BAD_LINE}, nothing after it was sent" in stderr
    records = read_topic(
        settings.kafka.bootstrap_servers, settings.topics.steps, count=len(expected), timeout=60
    )
    assert sorted(r.value for r in records) == sorted(expected)
    for record in records:
        assert record.key == decode_event(record.value).episode_id.encode()
