"""Shared fixtures. Integration tests get a real Kafka broker: KAFKA_BOOTSTRAP_SERVERS
when set, otherwise one started from dev/kafka for this test session. Tests that need
an inference server take `vllm_server` (tests/support/vllm_server.py), those that
upload to object storage `s3_server` and `bucket` (tests/support/seaweedfs.py), those
that stop and restart a broker `own_broker` (tests/support/own_broker.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import hypothesis
import pytest

from stream_export import settings

pytest_plugins = [
    "tests.support.vllm_server",
    "tests.support.seaweedfs",
    "tests.support.own_broker",
]

# Hypothesis fails an example that takes over 200 ms by default: on a shared machine
# that measures the load, not the code, and the suite's fuzz tests assert no timing.
hypothesis.settings.register_profile("stream-export", deadline=None)
hypothesis.settings.load_profile("stream-export")

ROOT = Path(__file__).resolve().parent.parent
DEV_KAFKA = ROOT / "dev" / "kafka"
HOW_TO = (
    "Integration tests need a Kafka broker. Start one with `dev/kafka start` and export "
    "KAFKA_BOOTSTRAP_SERVERS=$(dev/kafka status), or let the tests start it (needs Java 17 "
    "and Maven on PATH)."
)


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap address of a real broker for the whole session."""
    given = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    if given:
        yield given
        return
    state = tmp_path_factory.mktemp("kafka")
    env = {**os.environ, "KAFKA_STATE_DIR": str(state)}
    started = subprocess.run(
        [sys.executable, str(DEV_KAFKA), "start"], env=env, capture_output=True, text=True
    )
    if started.returncode != 0:
        pytest.fail(
            f"{HOW_TO}\n\ndev/kafka start failed:\n{started.stdout}{started.stderr}", pytrace=False
        )
    address = subprocess.run(
        [sys.executable, str(DEV_KAFKA), "status"], env=env, capture_output=True, text=True
    ).stdout.strip()
    try:
        yield address
    finally:
        subprocess.run([sys.executable, str(DEV_KAFKA), "stop"], env=env, capture_output=True)


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Fresh names per test, so tests never see each other's topics or groups."""
    token = uuid.uuid4().hex[:10]
    return lambda name: f"t-{token}-{name}"


@pytest.fixture
def settings_for(
    kafka_bootstrap: str, unique: Callable[[str], str], tmp_path: Path
) -> Callable[..., settings.Settings]:
    """Settings pointing at the test broker, fresh topics, memory store, tmp output."""

    def make(*overrides: str) -> settings.Settings:
        base = [
            f"kafka.bootstrap_servers={kafka_bootstrap}",
            f"topics.steps={unique('steps')}",
            f"topics.episodes={unique('episodes')}",
            f"topics.dead_letters={unique('dlq')}",
            "topics.partitions=2",
            f"worker.app_id={unique('app')}",
            "worker.store=memory://",
            f"worker.data_dir={tmp_path / 'state'}",
            f"sink.output_dir={tmp_path / 'out'}",
            "http.enabled=false",
        ]
        return settings.load(env={}, overrides=[*base, *overrides])

    return make
