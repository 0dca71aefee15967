"""The weight fence on the real broker with two gateway replicas in front of the real
vLLM: a trainer's begin returns only once no call is in flight on either replica,
new calls wait while fenced and then carry the committed version, calls in flight
finish under the old one; a lower commit is refused; and the faults: a replica
killed -9 while fenced (begin does not hang, the restarted replica holds), a
trainer killed between begin and commit (the fence expires: calls refused, none
recorded under the version that never loaded), a replica cut off from Kafka
during the fence (it holds its calls; they carry the new version once it is back).

Replica ``a`` reaches vLLM through a slow relay (a streamed call stays in flight
for seconds); ``b`` directly, with a planted partition switch."""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest

from stream_export import settings as config
from stream_export.errors import FenceError
from stream_export.settings import Settings
from stream_export.weights import WeightFence
from tests.support import relay
from tests.support.monitoring import free_port
from tests.support.processes import settings_args
from tests.support.vllm_server import VllmServer
from tests.support.weight_fleet import (
    PARTITION,
    Replica,
    call,
    error_code,
    recorded_versions,
)

pytestmark = pytest.mark.integration
LEASE_S = 2.0


class Fleet:
    def __init__(self, a: Replica, b: Replica, trainer: Settings, flag: Path, model: str) -> None:
        self.a, self.b, self.trainer, self.flag, self.model = a, b, trainer, flag, model


@pytest.fixture(scope="module")
def fleet(
    kafka_bootstrap: str, vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("fence")
    token = uuid.uuid4().hex[:10]
    flag = tmp / "partitioned"

    def settings(*more: str) -> Settings:
        return config.load(
            env={},
            overrides=[
                f"kafka.bootstrap_servers={kafka_bootstrap}",
                f"topics.steps=t-{token}-steps",
                f"weights.control_topic=t-{token}-weights",
                "weights.enabled=true",
                f"weights.lease_s={LEASE_S}",
                "weights.max_hold_s=20",
                "weights.ack_timeout_s=30",
                "gateway.ack_timeout_s=3",
                "gateway.retry_after_s=1",
                *more,
            ],
        )

    def replica(name: str, upstream: str, prelude: str | None = None) -> Replica:
        s = settings(
            f"weights.replica={name}",
            f"gateway.upstreams={upstream}/v1",
            f"gateway.port={free_port()}",
            f"gateway.state_dir={tmp / name}",
        )
        return Replica(name, s, tmp / f"{name}.log", prelude)

    with relay.running(vllm_server.url) as (slow, _):
        a = replica("a", slow).start()
        b = replica("b", vllm_server.url, PARTITION.format(flag=str(flag))).start()
        try:
            yield Fleet(a, b, settings(), flag, vllm_server.model)
        finally:
            for r in (a, b):
                assert r.process is not None
                r.process.stop()


async def test_begin_waits_for_calls_in_flight_and_held_calls_carry_the_committed_version(
    fleet: Fleet,
) -> None:
    async with WeightFence(fleet.trainer) as fence, aiohttp.ClientSession() as http:
        await fence.begin(1)
        await fence.commit(1)
        before = [await call(http, r, fleet.model) for r in (fleet.a, fleet.b)]

        streaming = asyncio.Event()
        slow = asyncio.create_task(
            call(http, fleet.a, fleet.model, stream=True, max_tokens=24, streaming=streaming)
        )
        await asyncio.wait_for(streaming.wait(), 30)
        begin = asyncio.create_task(fence.begin(2))
        await asyncio.to_thread(fleet.b.wait_metric, "stream_export_gateway_fenced", bool)
        held = asyncio.create_task(call(http, fleet.b, fleet.model))
        await asyncio.to_thread(
            fleet.b.wait_metric, 'stream_export_gateway_fence_calls_total{outcome="held"}', bool
        )
        assert not slow.done(), "the relay streams 24 tokens in seconds: still in flight"
        assert not begin.done(), "begin returned while a call was in flight on replica a"
        in_flight = await slow
        await asyncio.wait_for(begin, 30)
        assert not held.done(), "a new call went through while fenced"
        await fence.commit(2)
        released = await asyncio.wait_for(held, 30)

        with pytest.raises(FenceError) as lower:
            await fence.commit(1)
        assert lower.value.reason == "version_not_newer"
        with pytest.raises(FenceError) as again:
            await fence.begin(2)
        assert again.value.reason == "version_not_newer"
        with pytest.raises(FenceError) as unbegun:
            await fence.commit(3)
        assert unbegun.value.reason == "no_open_fence"
        after = await call(http, fleet.a, fleet.model)

    answers = [*before, in_flight, released, after]
    assert [a.status for a in answers] == [200] * 5
    versions = await asyncio.to_thread(
        recorded_versions, fleet.a.settings, [a.episode_id for a in answers]
    )
    assert list(versions.values()) == [1, 1, 1, 2, 2]
    for r in (fleet.a, fleet.b):
        r.wait_metric("stream_export_gateway_weight_version", lambda v: v == 2)
        assert r.metric('stream_export_gateway_version_calls_total{version="2"}')
    assert fleet.b.metric('stream_export_gateway_fence_calls_total{outcome="released"}') == 1
    assert fleet.a.metric("stream_export_gateway_fence_seconds_count")


async def test_a_replica_killed_while_fenced_neither_hangs_the_fence_nor_serves_unfenced(
    fleet: Fleet,
) -> None:
    assert fleet.b.process is not None
    async with WeightFence(fleet.trainer) as fence, aiohttp.ClientSession() as http:
        version = await _next(fence)
        streaming = asyncio.Event()
        # b has a call in flight (it would acknowledge only after it) when it dies.
        doomed = asyncio.create_task(
            call(http, fleet.b, fleet.model, stream=True, max_tokens=400, streaming=streaming)
        )
        await asyncio.wait_for(streaming.wait(), 30)
        begin = asyncio.create_task(fence.begin(version))
        await asyncio.to_thread(fleet.a.wait_metric, "stream_export_gateway_fenced", bool)
        fleet.b.process.kill9()
        began = time.monotonic()
        await asyncio.wait_for(begin, 30)  # b's lease runs out: not waited for
        waited = time.monotonic() - began
        await asyncio.gather(doomed, return_exceptions=True)  # cut off by the kill
        fleet.b.start()  # it reads the open fence first: holds its calls
        await asyncio.to_thread(fleet.b.wait_metric, "stream_export_gateway_fenced", bool)
        held = asyncio.create_task(call(http, fleet.b, fleet.model))
        await asyncio.to_thread(
            fleet.b.wait_metric, 'stream_export_gateway_fence_calls_total{outcome="held"}', bool
        )
        assert not held.done()
        await fence.commit(version)
        answer = await asyncio.wait_for(held, 30)
    assert waited < LEASE_S + 10
    assert answer.status == 200
    assert await asyncio.to_thread(recorded_versions, fleet.b.settings, [answer.episode_id]) == {
        answer.episode_id: version
    }


TRAINER = """
import asyncio, os, sys
from stream_export import settings
from stream_export.weights import WeightFence

async def main():
    fence = WeightFence(settings.load(env={{}}, overrides=sys.argv[2::2]))  # --set k=v ...
    await fence.start()
    await fence.begin({version}, timeout_s=2)
    print("begun", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


async def test_a_trainer_killed_between_begin_and_commit_expires_its_fence_and_loads_nothing(
    fleet: Fleet,
) -> None:
    async with WeightFence(fleet.trainer) as fence, aiohttp.ClientSession() as http:
        serving = await fence.serving()
        version = await _next(fence)
        trainer = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            TRAINER.format(version=version),
            *settings_args(fleet.trainer),
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            assert trainer.stdout is not None
            line = await asyncio.wait_for(trainer.stdout.readline(), 60)
            assert line.strip() == b"begun"
        finally:
            trainer.kill()  # -9: no abort, no commit
            await trainer.wait()
        refused = await asyncio.wait_for(call(http, fleet.a, fleet.model), 30)
        assert refused.status == 503, refused.body
        assert error_code(refused) == "fenced"
        assert refused.headers["Retry-After"] == "1"
        with pytest.raises(FenceError) as late:
            await fence.commit(version)
        assert late.value.reason == "fence_expired"
        assert await fence.serving() == serving  # the version that never loaded never serves
        await fence.begin(version)  # a new trainer takes over
        await fence.commit(version)
        answer = await call(http, fleet.a, fleet.model)
    assert answer.status == 200
    assert await asyncio.to_thread(recorded_versions, fleet.a.settings, [answer.episode_id]) == {
        answer.episode_id: version
    }


async def test_a_replica_cut_off_from_kafka_holds_its_calls_and_stamps_the_new_version(
    fleet: Fleet,
) -> None:
    async with WeightFence(fleet.trainer) as fence, aiohttp.ClientSession() as http:
        version = await _next(fence)
        fleet.flag.touch()
        try:
            # Its lease not renewed for half its length: b holds calls by itself.
            await asyncio.to_thread(fleet.b.wait_metric, "stream_export_gateway_fenced", bool)
            held = asyncio.create_task(call(http, fleet.b, fleet.model))
            began = time.monotonic()
            await fence.begin(version)  # not waiting for b past its lease
            waited = time.monotonic() - began
            await fence.commit(version)
            assert not held.done()
            during = await call(http, fleet.a, fleet.model)
        finally:
            fleet.flag.unlink()
        answer = await asyncio.wait_for(held, 30)
    assert waited < LEASE_S + 10
    assert (during.status, answer.status) == (200, 200), answer.body
    ids = [during.episode_id, answer.episode_id]
    assert await asyncio.to_thread(recorded_versions, fleet.a.settings, ids) == dict.fromkeys(
        ids, version
    )


async def _next(fence: WeightFence) -> int:
    serving = await fence.serving()
    assert serving is None or isinstance(serving, int)
    return (serving or 0) + 1


async def test_an_abort_with_a_long_reason_reopens_the_fence_for_every_reader(
    kafka_bootstrap: str,
) -> None:
    """begin's own abort names every replica that did not acknowledge: with many, its
    reason outgrows the contract's 1024 characters, a record replicas cannot read."""
    topic = f"t-{uuid.uuid4().hex[:10]}-weights"
    overrides = [f"kafka.bootstrap_servers={kafka_bootstrap}", f"weights.control_topic={topic}"]
    settings = config.load(env={}, overrides=overrides)
    async with WeightFence(settings) as fence:
        await fence.begin(1)  # no replica is live: acknowledged at once
        await fence.abort("not acknowledged by " + ", ".join(f"replica-{i}" for i in range(200)))
    async with WeightFence(settings) as reader:  # folds the topic as a replica does
        assert await reader.serving() is None
        assert reader.topic.unreadable == 0
        assert reader.topic.state.open_fence is None
