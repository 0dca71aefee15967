"""Start-up and command failures end as one line on stderr and exit 2, never a
crash log, a traceback or a silent exit 0: the real CLI, as a subprocess."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from stream_export.output.layout import lock_output
from stream_export.output.writer import Writer
from stream_export.runtime.metrics import Metrics
from stream_export.settings import Settings, load
from tests.support import own_broker
from tests.support.monitoring import free_port
from tests.support.mounts import tmpfs
from tests.support.processes import Worker, fleet_member, settings_args
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

#: No broker listens here: a check that reaches Kafka before the local ones fails differently.
NO_KAFKA = "kafka.bootstrap_servers=127.0.0.1:1"
#: A worker's log line once its groups stage has rebuilt the partitions it was given.
REBUILT = re.compile(r"open groups on partitions \[\d")


def cli(*args: str, timeout: float = 60) -> tuple[int, list[str]]:
    """Run ``stream-export ARGS``; (exit code, stderr lines)."""
    done = subprocess.run(
        [sys.executable, "-m", "stream_export", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return done.returncode, done.stderr.splitlines()


def worker(settings: Settings, timeout: float = 60) -> tuple[int, list[str]]:
    return cli("worker", *settings_args(settings), timeout=timeout)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[Path]:
    """A read-only tmpfs (the tests run as root, for whom permissions are no barrier)."""
    with tmpfs(tmp_path / "read-only", "ro,size=1m") as disk:
        yield disk


#: The folders the worker writes, each checked before Faust starts.
FOLDERS = ["sink.output_dir", "worker.data_dir"]


@pytest.mark.parametrize("setting", FOLDERS)
def test_folder_not_writable(
    settings_for: Callable[..., Settings], read_only: Path, setting: str
) -> None:
    rc, err = worker(settings_for(NO_KAFKA, f"{setting}={read_only}"))
    reason = setting.partition(".")[2]
    why = "is not writable: Read-only file system"
    assert (rc, err) == (2, [f"stream-export: {reason}: {setting} '{read_only}' {why}"])


@pytest.mark.parametrize("setting", FOLDERS)
def test_folder_that_cannot_be_created(
    settings_for: Callable[..., Settings], tmp_path: Path, read_only: Path, setting: str
) -> None:
    afile = tmp_path / "a-file"
    afile.write_text("x")
    reason = setting.partition(".")[2]
    for target, why in (
        (afile / "out", "cannot be created: Not a directory"),
        (read_only / "out", "cannot be created: Read-only file system"),
        (afile, "is not a directory"),
    ):
        rc, err = worker(settings_for(NO_KAFKA, f"{setting}={target}"))
        assert (rc, err) == (2, [f"stream-export: {reason}: {setting} '{target}' {why}"])


def test_missing_data_dir_parents_are_created(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """Faust creates only the last folder of worker.data_dir; the worker makes the
    rest, and then stops on what comes next (no broker), not a FileNotFoundError."""
    state = tmp_path / "deep" / "er" / "state"
    rc, err = worker(settings_for(NO_KAFKA, f"worker.data_dir={state}"))
    assert state.is_dir()
    assert rc == 2 and err[-1].startswith("stream-export: kafka_unavailable: "), err


def test_output_locked_by_another_worker(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    out = tmp_path / "shared"
    out.mkdir()
    held = lock_output(out, "training-data", "w-other")
    try:
        rc, err = worker(settings_for(NO_KAFKA, f"sink.output_dir={out}"))
    finally:
        os.close(held)
    assert (rc, err) == (
        2,
        [
            f"stream-export: output_in_use: {out}/training-data.* is in use by w-other pid "
            f"{os.getpid()}; give each worker its own sink.output_dir or sink.prefix"
        ],
    )


@pytest.mark.parametrize("setting", ["http.port", "http.probe_port"])
def test_http_port_in_use(settings_for: Callable[..., Settings], setting: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        other = "http.probe_port" if setting == "http.port" else "http.port"
        sets = (f"{setting}={port}", f"{other}={free_port()}")
        rc, err = worker(settings_for(NO_KAFKA, "http.enabled=true", *sets))
    assert (rc, err) == (
        2,
        [
            f"stream-export: http_port: cannot listen on 127.0.0.1:{port} (http.host, "
            f"{setting}): Address already in use; stop the process using it or choose "
            f"another {setting}"
        ],
    )


def test_export_with_the_broker_down(tmp_path: Path) -> None:
    port = free_port()
    rc, err = cli(
        "export", "--bootstrap-servers", f"127.0.0.1:{port}", "--to", str(tmp_path / "x.jsonl")
    )
    assert (rc, err) == (
        2,
        [
            "stream-export: kafka_unavailable: cannot reach Kafka over PLAINTEXT within 15s: "
            f"127.0.0.1:{port} (ConnectionRefusedError)"
        ],
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("once", [True, False])
def test_follow_a_folder_that_does_not_exist(tmp_path: Path, once: bool) -> None:
    missing = tmp_path / "nowhere"
    rc, err = cli("follow", str(missing), *(["--once"] if once else []), timeout=30)
    line = (
        f"stream-export: output_dir: {missing} is not a directory (follow reads a sink.output_dir)"
    )
    assert (rc, err) == (2, [line])


def test_an_error_inside_the_running_worker_is_one_line_too(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """The checks above pass, the worker starts, and its sink refuses the output
    folder (a checkpoint of another topic): the same one line, no crash log."""
    settings = settings_for()
    out = Path(settings.sink.output_dir)
    other = load(env={}, overrides=[f"sink.output_dir={out}"])
    Writer.open(other.sink, worker_id="w0", topic="another-topic", metrics=Metrics()).close()
    rc, err = worker(settings, timeout=90)
    assert rc == 2, "\n".join(err)
    assert err[-1] == (
        f"stream-export: config: {out}/.training-data.checkpoint.json belongs to topic "
        f"'another-topic', not '{settings.topics.episodes}'; use another sink.output_dir "
        "or sink.prefix"
    )
    text = "\n".join(err)
    assert "Traceback" not in text and "Crashed" not in text and "crash" not in text
    assert err[0].startswith("stream-export worker: reading")  # Faust did start


def test_workers_started_at_once_on_a_fresh_broker_all_run(tmp_path: Path) -> None:
    """Issue 36 item 4: on a new cluster, workers started together create the
    topics together, and each subscribes right after its own declarations. A topic
    just created (here or by the worker beside it) read as unknown in the metadata
    then: the assignment left it out (Faust's "Ignoring missing topic"; a table
    whose changelog it is holds no state at all) and the worker exited on a
    partition count of 0. Each must wait for the topic instead, and run."""
    for broker in own_broker.running(tmp_path / "kafka"):
        base = [
            f"kafka.bootstrap_servers={broker.address}",
            "topics.partitions=6",
            "groups.enabled=true",
            "http.enabled=false",
        ]
        workers = [
            Worker(
                load(env={}, overrides=[*base, *fleet_member(f"w{i}", tmp_path, tmp_path)]),
                tmp_path / f"w{i}.log",
            )
            for i in range(3)
        ]
        assert run_together(workers) == [0, 0, 0]


def run_together(workers: list[Worker]) -> list[int]:
    """Start ``workers`` at once, check each rebuilds its groups with every topic
    in its assignment, and stop them; their exit codes."""
    for w in workers:
        w.start()
    try:
        wait_for(
            lambda: all(REBUILT.search(w.log()) or not w.alive() for w in workers),
            timeout=90,
            what=lambda: "every worker to rebuild its groups\n" + workers[0].log()[-3000:],
        )
        for w in workers:
            log = w.log()
            assert w.alive(), log[-3000:]
            assert "Ignoring missing topic" not in log, log[-3000:]
    finally:
        codes = [w.stop() for w in workers]
    return codes
