"""`stream-export topics apply|check` on a real broker: creates from the specs, reports
drift without repairing or destroying anything, and the worker refuses fatal drift."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from stream_export import cli
from stream_export.contract.topics import TopicSpec, load_specs
from stream_export.kafka import topics
from stream_export.settings import Settings
from tests.support.processes import Worker, settings_args
from tests.support.topic_reader import read_topic
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def run_cli(capsys: pytest.CaptureFixture[str], settings: Settings, action: str) -> tuple[int, str]:
    code = cli.main(["topics", action, *settings_args(settings)])
    return code, capsys.readouterr().out


def test_apply_creates_every_topic_from_its_spec_and_then_check_passes(
    settings_for: Callable[..., Settings], capsys: pytest.CaptureFixture[str]
) -> None:
    settings = settings_for()
    code, out = run_cli(capsys, settings, "check")
    assert code == 1 and out.count(": missing") == 3

    code, out = run_cli(capsys, settings, "apply")
    assert code == 0 and out.count(": created") == 3

    code, out = run_cli(capsys, settings, "check")
    assert code == 0 and out.count(": ok") == 3, out
    statuses = asyncio.run(topics.apply(settings))
    assert [s.state for s in statuses] == ["ok", "ok", "ok"]
    specs: dict[str, TopicSpec] = {s.role: s for s in load_specs()}
    for status in statuses:
        assert status.name == getattr(settings.topics, status.role)
        assert not status.drift, "the broker has exactly the spec's partitions and configs"
        assert specs[status.role].config


async def make_drifted_steps_topic(settings: Settings) -> None:
    """The steps topic as someone else made it: 3 partitions, 1 s retention, one message."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(settings.topics.steps, 3, 1, topic_configs={"retention.ms": "3600000"})]
        )
    finally:
        await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=settings.kafka.bootstrap_servers)
    await producer.start()
    try:
        await producer.send_and_wait(settings.topics.steps, b"precious", key=b"k")
    finally:
        await producer.stop()


def refused(settings: Settings, tmp_path: Path) -> str:
    """The log of a worker that refused to start on its topics (exit code 2)."""
    worker = Worker(settings, tmp_path / "worker.log").start()
    try:
        wait_for(lambda: not worker.alive(), timeout=60, what="the worker to refuse its topics")
    finally:
        worker.stop()
    assert worker.proc is not None and worker.proc.returncode == 2
    return worker.log()


def test_drift_is_reported_never_repaired_and_the_worker_refuses_to_start(
    settings_for: Callable[..., Settings], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    settings = settings_for()
    asyncio.run(make_drifted_steps_topic(settings))
    steps = settings.topics.steps

    code, out = run_cli(capsys, settings, "apply")
    assert code == 1, "partition drift on the steps topic is fatal for the worker"
    assert f"{steps} (steps): drift" in out
    assert "partitions is 3, spec wants 2 (fatal for the worker)" in out
    assert "retention.ms is 3600000, spec wants 604800000" in out
    assert out.count(": created") == 2

    code, out = run_cli(capsys, settings, "check")
    assert code == 1 and "retention.ms is 3600000" in out, "apply changed nothing"
    (status,) = [s for s in asyncio.run(topics.check(settings)) if s.role == "steps"]
    assert {d.setting for d in status.drift} >= {"partitions", "retention.ms"}
    records = read_topic(settings.kafka.bootstrap_servers, steps, count=1, timeout=30)
    assert [r.value for r in records] == [b"precious"]

    log = refused(settings, tmp_path)
    assert "topic_drift" in log and "partitions is 3" in log


def test_the_worker_refuses_an_episodes_topic_too_small_for_its_records(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    """An episodes topic made elsewhere with the broker's default max.message.bytes
    cannot take an episode of assemble.max_episode_bytes: the worker says so and
    stops at start-up, instead of crash-looping on the first large episode."""
    settings = settings_for()

    async def make() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=settings.kafka.bootstrap_servers)
        await admin.start()
        try:
            await admin.create_topics([NewTopic(settings.topics.episodes, 2, 1)])
        finally:
            await admin.close()

    asyncio.run(make())
    log = refused(settings, tmp_path)
    assert "max.message.bytes is 1048588, spec wants 16842752" in log, log[-2000:]
    assert "raise its max.message.bytes and segment.bytes" in log
