"""A broker of the benchmark's own: dev/kafka with its own state folder, stopped at the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Final

from bench.report import BenchError

DEV_KAFKA: Final = Path(__file__).resolve().parent.parent / "dev" / "kafka"


class OwnBroker:
    """``with OwnBroker(state) as bootstrap:`` starts dev/kafka on a free port."""

    def __init__(self, state: Path) -> None:
        self.env = {**os.environ, "KAFKA_STATE_DIR": str(state)}

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(DEV_KAFKA), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=180,
        )

    def __enter__(self) -> str:
        started = self._run("start")
        status = self._run("status")
        if started.returncode or status.returncode:
            self._run("stop")
            raise BenchError(f"dev/kafka did not start: {started.stdout}{started.stderr}".strip())
        return status.stdout.strip()

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._run("stop")
