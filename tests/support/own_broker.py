"""A dev/kafka broker of the tests' own, on a fixed port, for tests that stop, restart or
wipe a broker (never the shared one).

Tests that stop and start it again take the ``own_broker`` fixture: one broker for
the session, running when each test begins (formatting and starting a fresh one
cost every such test 6-30 s). A test that needs a fresh broker, or wipes one,
starts its own with :func:`running`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

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


@pytest.fixture(scope="session")
def _session_own_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    yield from running(tmp_path_factory.mktemp("own-kafka"))


@pytest.fixture
def own_broker(_session_own_broker: Broker) -> Broker:
    """The session's own broker, running (started again if a test left it stopped);
    each test uses topics of its own on it."""
    _session_own_broker.start()  # a no-op when it answers
    return _session_own_broker
