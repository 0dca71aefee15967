"""README command 1 (dev/demo): episode, group, preference and prompt lines appear,
and Ctrl-C stops everything it started."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.monitoring import free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


#: The group outputs the demo must write, with the columns of their rows.
GROUPED = {
    "groups": {
        "group_id",
        "prompt",
        "completions",
        "episode_ids",
        "rewards",
        "advantages",
        "outcomes",
        "size",
        "expected_size",
        "complete",
        "close_reason",
        "missing",
        "truncated",
        "duplicates",
        "mean",
        "std",
        "zero_variance",
        "estimator",
        "eps",
    },
    "preference": {
        "prompt",
        "chosen",
        "rejected",
        "group_id",
        "chosen_reward",
        "rejected_reward",
        "margin",
    },
    "prompts": {"prompt", "group_id", "pass_rate", "mean_reward", "scored"},
}


def _lines(path: Path) -> list[dict[str, Any]]:
    """The complete JSON lines written to ``path`` so far (none if it is missing)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        if text in cmdline or text.encode() in environ:
            found.append(f"{proc.name}: {cmdline[:120]}")
    return found


def test_demo_writes_lines_and_sigint_leaves_no_process(tmp_path: Path) -> None:
    marker = str(tmp_path)
    env = {
        **os.environ,
        "KAFKA_STATE_DIR": str(tmp_path / "kafka"),
        "STREAM_EXPORT_SINK_OUTPUT_DIR": str(tmp_path / "out"),
        "STREAM_EXPORT_WORKER_DATA_DIR": str(tmp_path / "state"),
        "STREAM_EXPORT_HTTP_PORT": str(free_port()),
        "DEMO_RATE": "20",
    }
    env.pop("KAFKA_BOOTSTRAP_SERVERS", None)
    out = tmp_path / "out" / "training-data.jsonl"
    grouped = {name: tmp_path / "out" / f"training-data.{name}.jsonl" for name in GROUPED}
    log = tmp_path / "demo.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(
            [str(ROOT / "dev" / "demo")],
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        for path in [out, *grouped.values()]:
            wait_for(
                functools.partial(_lines, path),
                timeout=120,
                what=f"lines in {path}\n{log.read_text()[-2000:]}",
            )
        # a terminal's Ctrl-C: SIGINT to the whole foreground process group
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "dev/demo: writing" in log.read_text()
    for line in out.read_text().splitlines():
        record = json.loads(line)
        assert isinstance(record["prompt"], str) and record["prompt"]
        assert isinstance(record["completion"], str) and record["completion"]
    rows = {name: _lines(path) for name, path in grouped.items()}
    assert all(rows.values()), rows
    for name, records in rows.items():
        for record in records:
            assert set(record) == GROUPED[name], record
            assert record["group_id"].startswith("task-") and record["prompt"]
    for prompt in rows["prompts"]:  # each demo task is a full group
        assert prompt["scored"] == 4 and prompt["pass_rate"] in {0, 0.25, 0.5, 0.75, 1}
    for pair in rows["preference"]:
        assert pair["chosen"] != pair["rejected"] and pair["margin"] > 0
    leftovers = wait_for(
        lambda: not _processes_mentioning(marker) or None,
        timeout=30,
        what=f"no process left: {_processes_mentioning(marker)}",
    )
    assert leftovers
