"""The four systems the pipeline benchmark runs, each as its own process, and how
one run of one of them is measured (rate, CPU from /proc, peak RSS)."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, Protocol

from bench import BenchError
from bench.bench_assemble import Child
from bench.runs import Run, window_rate
from stream_export.output.follow import Follower
from stream_export.settings import Settings
from tests.support.processes import Worker, settings_args

POLL_S: Final = 0.02
KCAT_MISSING: Final = (
    "kcat is not installed, so its rows are missing; install it with "
    "`apt-get install -y kcat` (Debian package kcat)"
)
_TICK: Final = os.sysconf("SC_CLK_TCK")


# -- /proc -------------------------------------------------------------------------


def _tree(pid: int) -> list[int]:
    """``pid`` and its live descendants."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except OSError:
            continue
        for tid in tasks:
            with contextlib.suppress(OSError):
                todo += map(int, Path(f"/proc/{p}/task/{tid}/children").read_text().split())
    return out


def stat_cpu(text: str) -> tuple[float, float]:
    """(own utime+stime, reaped children's cutime+cstime) in seconds, from a
    /proc/<pid>/stat line (the command name may hold spaces and parentheses)."""
    fields = text[text.rindex(")") + 2 :].split()
    utime, stime, cutime, cstime = (int(f) for f in fields[11:15])
    return (utime + stime) / _TICK, (cutime + cstime) / _TICK


def cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` and its children, live and reaped."""
    total = 0.0
    for p in _tree(pid):
        try:
            own, reaped = stat_cpu(Path(f"/proc/{p}/stat").read_text())
        except OSError:
            continue
        total += own + reaped
    return total


def peak_rss_mb(pid: int) -> float:
    """VmHWM of ``pid`` plus that of its live children."""
    kb = 0
    for p in _tree(pid):
        try:
            status = Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        # A process that has exited (a zombie) has no memory lines.
        kb += next((int(ln.split()[1]) for ln in status.splitlines() if ln[:6] == "VmHWM:"), 0)
    return kb / 1024


# -- running one system -------------------------------------------------------------


class Handle(Protocol):
    def done(self) -> float:
        """Share of the expected output there so far (0 to 1)."""
        ...

    def alive(self) -> bool: ...

    def cpu(self) -> float:
        """CPU seconds so far of the process and its children."""
        ...

    def rss(self) -> float:
        """Peak RSS in MB of the process and its children."""
        ...

    def stop(self) -> None: ...


class _Process:
    """A system's process, measured through /proc while it runs."""

    pid: int

    def cpu(self) -> float:
        return cpu_seconds(self.pid)

    def rss(self) -> float:
        return peak_rss_mb(self.pid)


def _stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout: float = 20) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class _Lines(_Process):
    """A process that writes lines to a file; counts them, reading only what is new."""

    def __init__(self, proc: subprocess.Popen[bytes], out: Path, expected: int) -> None:
        self.proc = proc
        self.pid = proc.pid
        self.fh = out.open("rb")
        self.expected = expected
        self.lines = 0

    def done(self) -> float:
        while chunk := self.fh.read(1 << 20):
            self.lines += chunk.count(b"\n")
        return self.lines / self.expected

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        _stop(self.proc)
        self.fh.close()


class Kcat(_Lines):
    """kcat reads every partition from the beginning to the end (-e), values to a file.

    It buffers its output until it exits, so it is done when it has exited with
    every line written; its CPU and peak RSS then come from the kernel's resource
    usage of the reaped child.
    """

    def __init__(self, bootstrap: str, topic: str, out: Path, events: int) -> None:
        with out.open("wb") as fh:
            proc = subprocess.Popen(
                ["kcat", "-C", "-q", "-e", "-o", "beginning", "-b", bootstrap, "-t", topic],
                stdout=fh,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        super().__init__(proc, out, events)
        self.usage: resource.struct_rusage | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("kcat") is not None

    def _reap(self) -> bool:
        if self.usage is None:
            pid, status, usage = os.wait4(self.pid, os.WNOHANG)
            if pid:
                self.usage = usage
                self.proc.returncode = os.waitstatus_to_exitcode(status)
        return self.usage is not None

    def done(self) -> float:
        exited = self._reap()  # before reading: every line is in the file once it exited
        share = super().done()
        return share if exited else min(share, 0.999)

    def alive(self) -> bool:
        return not self._reap() or self.lines >= self.expected

    def cpu(self) -> float:
        if self.usage is None:
            return super().cpu()
        return self.usage.ru_utime + self.usage.ru_stime

    def rss(self) -> float:
        return super().rss() if self.usage is None else self.usage.ru_maxrss / 1024

    def stop(self) -> None:
        if not self._reap():
            os.killpg(self.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.fh.close()


class RawPipeline(_Lines):
    def __init__(self, settings: Settings, out: Path, log: Path, records: int) -> None:
        out.touch()
        with log.open("ab") as err:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bench.raw_pipeline", str(out), *settings_args(settings)],
                stderr=err,
                start_new_session=True,
            )
        super().__init__(proc, out, records)


class RawTokens(_Lines):
    """bench/raw_tokens.py: the hand-written token pipeline, counted by its rows."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        group: str,
        out: Path,
        log: Path,
        rows: int,
        fetch_bytes: int,
    ) -> None:
        out.touch()
        command = [sys.executable, "-m", "bench.raw_tokens", str(out)]
        command += ["--bootstrap", bootstrap, "--topic", topic, "--group", group]
        command += ["--fetch-bytes", str(fetch_bytes)]
        with log.open("ab") as err:
            proc = subprocess.Popen(command, stderr=err, start_new_session=True)
        super().__init__(proc, out, rows)


class BareFaust(_Process):
    """bench_assemble's bare agent; its progress lines are read on a thread."""

    def __init__(self, settings: Settings, log: Path, events: int) -> None:
        self.child = Child("bare", settings, log)
        self.pid = self.child.proc.pid
        self.events = events
        self.consumed = 0
        self.failed: BaseException | None = None
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            for _, consumed, _ in self.child.progress():
                self.consumed = consumed
        except RuntimeError as exc:  # the child exited
            self.failed = exc

    def done(self) -> float:
        return self.consumed / self.events

    def alive(self) -> bool:
        return self.failed is None

    def stop(self) -> None:
        if self.child.proc.poll() is None:
            self.child.kill(signal.SIGTERM)
        else:
            self.child.log.close()


class RealWorker(_Process):
    """``stream-export worker``; its output is counted with the writer's own reader."""

    def __init__(
        self, settings: Settings, log: Path, records: int, prelude: str | None = None
    ) -> None:
        self.worker = Worker(settings, log, prelude=prelude).start()
        assert self.worker.proc is not None
        self.pid = self.worker.proc.pid
        self.follower = Follower(settings.sink.output_dir, settings.sink.prefix, wait=False)
        self.records = records
        self.seen = 0
        #: Called with each new record, for the latency run.
        self.on_line: Callable[[bytes], None] | None = None

    def done(self) -> float:
        for line in self.follower.available():
            self.seen += 1
            if self.on_line is not None:
                self.on_line(line)
        return self.seen / self.records

    def alive(self) -> bool:
        return self.worker.alive()

    def stop(self) -> None:
        self.worker.stop(timeout=20)


def measure(
    system: str,
    round_: int,
    start: Callable[[], Handle],
    events: int,
    timeout: float,
    progress: Callable[[float], None],
) -> Run:
    """Start a system, poll it until all its output is there, stop it; its figures."""
    started = time.monotonic()
    handle = start()
    first: tuple[float, float, float] | None = None
    try:
        while True:
            share = handle.done()
            now = time.monotonic()
            if share > 0 and first is None:
                first = (now, share, handle.cpu())
            if share >= 1 and first is not None:
                last = (now, share, handle.cpu())
                rss = handle.rss()
                break
            progress(share)
            if not handle.alive():
                raise BenchError(f"{system} stopped before it was done ({share:.0%} of its output)")
            if now - started > timeout:
                raise BenchError(f"{system} did not finish within {timeout:.0f}s ({share:.0%})")
            time.sleep(POLL_S)
    finally:
        handle.stop()
    rate, cpu = window_rate(first, last, events)
    return Run(
        system=system,
        round=round_,
        events_per_s=rate,
        cpu_us_per_event=cpu,
        peak_rss_mb=rss,
        wall_s=now - started,
    )
