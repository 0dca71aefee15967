"""A dev/kafka broker of a test's own, on a fixed port, for tests that stop, restart or
wipe a broker (never the shared one)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.conftest import DEV_KAFKA
from tests.support.monitoring import free_port


class Broker:
    """dev/kafka with its own state folder, always on the same port."""

    def __init__(self, state: Path) -> None:
        self.state = state
        self.env = {**os.environ, "KAFKA_STATE_DIR": str(state)}
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        """Run ``dev/kafka ARGS`` for this broker; fail unless it succeeds."""
        done = subprocess.run(
            [sys.executable, str(DEV_KAFKA), *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=150,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        return done

    def start(self, *more: str) -> None:
        """Start on this broker's port; ``more``: extra ``dev/kafka start`` flags."""
        self.run("start", "--port", str(self.port), *more)

    def stop(self) -> None:
        self.run("stop")

    def wipe(self) -> None:
        """What `docker compose down && up` does to a Kafka without a volume."""
        self.stop()
        shutil.rmtree(self.state)
        self.start()


def running(state: Path) -> Iterator[Broker]:
    """A started broker, stopped afterwards (the body of a fixture)."""
    broker = Broker(state)
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()
