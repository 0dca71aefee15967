"""What dev/kafka and dev/vllm share to run a server in the background from a state
folder: a free port, the pid file, and stopping the server's whole process group.
Standard library only (both run before the project's virtual environment exists)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from collections.abc import Iterable
from pathlib import Path


def free_ports(count: int, taken: Iterable[int] = ()) -> list[int]:
    """COUNT distinct free ports, none of them in TAKEN. Each stays bound until all
    are found: ports asked for one at a time may come back twice from the kernel,
    and two listeners of one server on one port kill it at start."""
    with contextlib.ExitStack() as held:
        found: list[int] = []
        while len(found) < count:
            s = held.enter_context(socket.socket())
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
            if port not in taken:
                found.append(port)
        return found


def free_port(taken: Iterable[int] = ()) -> int:
    return free_ports(1, taken)[0]


def read_int(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def read_pid(state: Path) -> int | None:
    """The pid in STATE/pid when that process is alive."""
    pid = read_int(state / "pid")
    if pid is None:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def stop_pid(state: Path, pid: int, timeout: float = 30.0) -> None:
    """SIGTERM the process group led by ``pid``, SIGKILL it after ``timeout``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # reap it when it is our child
        time.sleep(0.1)
    else:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    (state / "pid").unlink(missing_ok=True)
