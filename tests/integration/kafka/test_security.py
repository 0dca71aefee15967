"""Kafka security end to end: our own broker with a SASL_PLAINTEXT listener
(SCRAM-SHA-256/512 and PLAIN). The right credentials work for producing,
consuming and a whole worker; wrong ones fail fast with a clear typed error; the
password never reaches a log."""

from __future__ import annotations

import asyncio
import secrets
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer

from stream_export.contract.decoding import encode
from stream_export.errors import AuthenticationError
from stream_export.kafka import topics
from stream_export.kafka.connection import check_kafka, kafka_client_kwargs
from stream_export.ops import demo
from stream_export.settings import Settings, load
from tests.support.monitoring import free_port, get
from tests.support.own_broker import Broker
from tests.support.processes import Worker, settings_args
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

USER = "agent-writer"


class SaslBroker(Broker):
    """The test's own broker with a SASL listener for USER and this password."""

    def __init__(self, state: Path, password: str) -> None:
        super().__init__(state)
        self.password = password


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslBroker]:
    b = SaslBroker(tmp_path_factory.mktemp("sasl-kafka"), f"pw-{secrets.token_hex(8)}")
    b.start("--sasl-scram", f"{USER}:{b.password}")
    try:
        yield b
    finally:
        b.stop()


def sasl(broker: SaslBroker, mechanism: str, password: str, *more: str) -> Settings:
    address = broker.run("status", "--sasl").stdout.strip()
    token = uuid.uuid4().hex[:8]
    return load(
        env={},
        overrides=[
            f"kafka.bootstrap_servers={address}",
            "kafka.security_protocol=SASL_PLAINTEXT",
            f"kafka.sasl_mechanism={mechanism}",
            f"kafka.sasl_username={USER}",
            f"kafka.sasl_password={password}",
            f"topics.steps=s-{token}-steps",
            f"topics.episodes=s-{token}-episodes",
            f"topics.dead_letters=s-{token}-dlq",
            "topics.partitions=2",
            f"worker.app_id=s-{token}-app",
            *more,
        ],
    )


async def round_trip(settings: Settings) -> bytes:
    await topics.ensure(settings)
    kwargs = kafka_client_kwargs(settings)
    servers = settings.kafka.bootstrap_servers
    producer = AIOKafkaProducer(bootstrap_servers=servers, acks="all", **kwargs)
    await producer.start()
    try:
        await producer.send_and_wait(settings.topics.steps, b"hello", key=b"k", partition=0)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(
        settings.topics.steps, bootstrap_servers=servers, auto_offset_reset="earliest", **kwargs
    )
    await consumer.start()
    try:
        message = await asyncio.wait_for(consumer.getone(), 30)
    finally:
        await consumer.stop()
    value: bytes = message.value
    return value


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_right_credentials_produce_and_consume(broker: SaslBroker, mechanism: str) -> None:
    settings = sasl(broker, mechanism, broker.password)
    asyncio.run(check_kafka(settings))
    assert asyncio.run(round_trip(settings)) == b"hello"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_wrong_password_fails_fast_with_a_clear_message(broker: SaslBroker, mechanism: str) -> None:
    settings = sasl(broker, mechanism, "not-the-password")
    began = time.monotonic()
    with pytest.raises(AuthenticationError) as info:
        asyncio.run(check_kafka(settings))
    assert time.monotonic() - began < 5
    message = str(info.value)
    assert "rejected" in message and USER in message and mechanism in message
    assert "not-the-password" not in message


def test_worker_with_a_wrong_password_exits_at_once(broker: SaslBroker, tmp_path: Path) -> None:
    settings = sasl(broker, "SCRAM-SHA-512", "wrong-pw-123", f"sink.output_dir={tmp_path}")
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "stream_export", "worker", *settings_args(settings)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert time.monotonic() - began < 30
    assert "kafka_authentication" in output and f"user '{USER}'" in output
    assert "wrong-pw-123" not in output


def worker_settings(
    broker: SaslBroker, tmp_path: Path, mechanism: str, password: str, *more: str
) -> tuple[Settings, str]:
    """Settings for a worker on the SASL broker, logging at debug; and its HTTP address."""
    port = free_port()
    settings = sasl(
        broker,
        mechanism,
        password,
        *more,
        "worker.store=memory://",
        f"worker.data_dir={tmp_path / 'state'}",
        "worker.log_level=debug",
        f"sink.output_dir={tmp_path / 'out'}",
        "http.enabled=true",
        f"http.port={port}",
    )
    return settings, f"http://127.0.0.1:{port}"


def wait_ready(worker: Worker, url: str) -> None:
    wait_for(
        lambda: get(f"{url}/readyz")[0] == 200,
        timeout=90,
        what=f"the SASL worker ready\n{worker.log()[-3000:]}",
    )


def test_worker_with_scram_credentials_from_a_file(broker: SaslBroker, tmp_path: Path) -> None:
    password_file = tmp_path / "kafka-password"
    password_file.write_text(broker.password + "\n")
    settings, url = worker_settings(
        broker, tmp_path, "SCRAM-SHA-512", "", f"kafka.sasl_password_file={password_file}"
    )
    out = tmp_path / "out" / "training-data.jsonl"
    with Worker(settings, tmp_path / "worker.log") as worker:

        async def send(count: int) -> None:
            producer = AIOKafkaProducer(
                bootstrap_servers=settings.kafka.bootstrap_servers,
                **kafka_client_kwargs(settings),
            )
            await producer.start()
            try:
                for _, events in zip(range(count), demo.episodes(seed=11), strict=False):
                    for event in events:
                        key = event.episode_id.encode()
                        await producer.send(settings.topics.steps, encode(event), key=key)
                await producer.flush()
            finally:
                await producer.stop()

        wait_ready(worker, url)
        asyncio.run(send(10))

        def written() -> bool:
            return out.exists() and len(out.read_text().splitlines()) >= 10

        wait_for(written, timeout=60, what=f"10 records\n{worker.log()[-3000:]}")
        wait_for(  # the lag monitor's own client logs in too
            lambda: b"stream_export_consumer_lag_messages{" in get(f"{url}/metrics")[1],
            timeout=30,
            what=f"consumer lag\n{worker.log()[-3000:]}",
        )
        log = worker.log()
    assert "DEBUG" in log  # the most talkative level ...
    assert broker.password not in log  # ... still never shows the password


def test_a_worker_given_the_password_as_a_setting_never_shows_it(
    broker: SaslBroker, tmp_path: Path
) -> None:
    """The password as kafka.sasl_password (decoded into a Secret): it logs in, and no
    endpoint and no log line at debug level shows it."""
    settings, url = worker_settings(broker, tmp_path, "SCRAM-SHA-256", broker.password)
    assert broker.password not in repr(settings)
    with Worker(settings, tmp_path / "worker.log") as worker:
        wait_ready(worker, url)
        pages = {path: get(f"{url}{path}")[1] for path in ("/status.json", "/metrics", "/")}
        log = worker.log()
    assert b'"worker_id"' in pages["/status.json"] and b"stream_export_" in pages["/metrics"]
    for path, body in pages.items():
        assert broker.password.encode() not in body, path
    assert "DEBUG" in log and broker.password not in log
