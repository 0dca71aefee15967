"""README command 1 (dev/demo): lines appear, and Ctrl-C stops everything it started."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.support.monitoring import free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


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
        wait_for(
            lambda: out.exists() and out.stat().st_size > 0,
            timeout=120,
            what=f"lines in {out}\n{log.read_text()[-2000:]}",
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
    leftovers = wait_for(
        lambda: not _processes_mentioning(marker) or None,
        timeout=30,
        what=f"no process left: {_processes_mentioning(marker)}",
    )
    assert leftovers
