"""Run real stream-export processes (worker, CLI) for integration tests."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

import msgspec
import pytest

from stream_export.settings import Settings
from stream_export.settings.values import Secret
from tests.support.waiting import wait_for

#: What Python's faulthandler prints before each thread's stack.
STACKS = "(most recent call first)"
#: The repository's dev tools (dev/kafka, dev/vllm, dev/seaweedfs, ...).
DEV = Path(__file__).resolve().parents[2] / "dev"


def dev_tool(
    name: str, *args: str, env: dict[str, str] | None = None, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Run ``dev/<name>`` (a Python script) with this interpreter, output captured."""
    return subprocess.run(
        [sys.executable, str(DEV / name), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def trainer_pythons() -> dict[str, str]:
    """The Python of each dev/trainers environment, by name (``trainers``, ``art``);
    fails the test saying how to build them when they are missing."""
    found = dev_tool("trainers", "paths", timeout=60)
    if found.returncode != 0:
        pytest.fail(found.stderr, pytrace=False)
    pythons: dict[str, str] = json.loads(found.stdout)
    return pythons


def fleet_member(name: str, state: Path, out: Path) -> tuple[str, ...]:
    """Settings of worker ``name`` of a fleet sharing the output folder ``out``: its own
    worker id, state folder (below ``state``) and file prefix."""
    return (
        f"worker.worker_id={name}",
        f"worker.data_dir={state / name}",
        f"sink.output_dir={out}",
        f"sink.prefix={name}",
    )


def settings_args(settings: Settings) -> list[str]:
    """``--set`` flags that reproduce ``settings`` in a child process."""
    args: list[str] = []
    # The child needs the clear text of secrets (test credentials only).
    for section, values in msgspec.to_builtins(settings, enc_hook=Secret.reveal).items():
        for field, value in values.items():
            if value is None:
                continue
            if isinstance(value, list):
                value = ",".join(str(v) for v in value)
            elif isinstance(value, bool):
                value = str(value).lower()
            args += ["--set", f"{section}.{field}={value}"]
    return args


def export(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stream_export", "export", *settings_args(settings), *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


class Worker:
    """``stream-export worker`` as a child process; a context manager that stops it."""

    command = "worker"

    def __init__(
        self,
        settings: Settings,
        log: Path,
        *extra: str,
        prelude: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.log_path = log
        self.extra = extra
        #: Variables added to this process's environment (credentials).
        self.env = env or {}
        #: Python run in the worker's process before the CLI (a planted fault).
        self.prelude = prelude
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Worker:
        entry = ["-m", "stream_export"]
        if self.prelude is not None:
            main = "import sys\nfrom stream_export.cli import main\nsys.exit(main(sys.argv[1:]))"
            entry = ["-c", f"{self.prelude}\n{main}"]
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, *entry, self.command, *settings_args(self.settings), *self.extra],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **self.env, "PYTHONUNBUFFERED": "1"},
            )
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill9(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout: float = 45) -> int:
        """SIGTERM and wait. A worker's own deadline (``worker.stop_deadline_s``, 30 s
        by default) ends a stuck stop with exit code 1 and its threads' stacks in
        the log; a process still running after ``timeout`` is made to print them
        (SIGQUIT) and killed (-9). Unless the stop exits 0, the end of the log goes
        to this process's stderr (pytest shows it with a failure)."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGQUIT)
            with contextlib.suppress(AssertionError):
                wait_for(lambda: STACKS in self.log(), timeout=5, what="the stacks")
            self.kill9()
            code = -9
        if code != 0:
            print(
                f"{self.command} stopped with {code} after SIGTERM ({timeout:.0f}s allowed); "
                f"the end of its log:\n{self.log()[-12_000:]}",
                file=sys.stderr,
            )
        return code

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def __enter__(self) -> Worker:
        return self.start()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class Gateway(Worker):
    """``stream-export gateway`` as a child process."""

    command = "gateway"
