"""The sink in the real worker: repeats, dead letters, partition folders, a full disk."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import re
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer

from stream_export.settings import Settings
from tests.support.monitoring import free_port, get
from tests.support.mounts import tmpfs
from tests.support.processes import Worker
from tests.support.sinkkafka import episode, message, prompts, publish
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


async def _dead_letters(settings: Settings, count: int) -> list[dict[str, bytes]]:
    consumer = AIOKafkaConsumer(
        settings.topics.dead_letters,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    got: list[dict[str, bytes]] = []
    try:
        async with asyncio.timeout(30):
            while len(got) < count:
                for messages in (await consumer.getmany(timeout_ms=500)).values():
                    got += [dict(m.headers) | {"value": m.value} for m in messages]
    finally:
        await consumer.stop()
    return got


def test_repeats_are_dropped_bad_input_is_dead_lettered_and_folders_stay_inside(
    settings_for: Callable[..., Settings], tmp_path: Path
) -> None:
    settings = settings_for("sink.partition_by=domain")
    out = Path(settings.sink.output_dir)
    domains = ["math", "../../escape", "/etc", "games"]
    publish(
        settings,
        [message(episode(i, metadata={"domain": domains[i % 4]})) for i in range(40)]
        + [(b"k", b'{"episode_id": "x"}')],
    )
    expected = Counter(f"task {i}" for i in range(40))
    with Worker(settings, tmp_path / "w1.log") as worker:
        wait_for(lambda: prompts(out) == expected, timeout=60, what=f"40 records\n{worker.log()}")
    publish(settings, [message(episode(i, metadata={"domain": "math"})) for i in (0, 1, 40)])
    expected["task 40"] = 1
    with Worker(settings, tmp_path / "w2.log") as worker:
        wait_for(lambda: prompts(out) == expected, timeout=60, what=f"task 40\n{worker.log()}")
    state = tmp_path / "state"
    outside = [
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and out not in p.parents and state not in p.parents and p.suffix != ".log"
    ]
    assert outside == []
    assert not list(Path("/etc").glob("training-data*"))
    folders = {p.name for p in out.iterdir() if p.is_dir()}
    assert folders == {"domain=math", "domain=games", "domain=_rejected"}
    assert sum(prompts(out).values()) == 41
    # the first worker's stop may come before the broker acknowledged the dead letter:
    # the checkpoint then stops before the bad message, and the second sends it again
    dead, *again = asyncio.run(_dead_letters(settings, 1))
    assert dead["x-stage"] == b"sink" and dead["value"] == b'{"episode_id": "x"}'
    assert all(copy == dead for copy in again), again


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs mounted for this test."""
    with tmpfs(tmp_path / "disk", "size=2m") as disk:
        yield disk


def fill(disk: Path) -> Path:
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as fh, contextlib.suppress(OSError):
        while True:
            fh.write(b"\0" * 4096)
    with pytest.raises(OSError) as full:
        (disk / "probe").write_bytes(b"x" * 8192)
    assert full.value.errno == errno.ENOSPC
    return filler


def sink_lag(url: str, topic: str) -> float | None:
    """The sink's lag on /metrics, its partitions of the episodes topic summed (None
    before it is measured)."""
    status, body = get(f"{url}/metrics")
    pattern = rf'^stream_export_consumer_lag_messages{{partition="\d+",topic="{topic}"}} (\S+)$'
    found = re.findall(pattern, body.decode(), flags=re.M) if status == 200 else []
    return sum(float(v) for v in found) if found else None


def gauge(url: str) -> str | None:
    """The episode sink's stream_export_sink_paused value on /metrics."""
    found = re.search(
        r'^stream_export_sink_paused{output="training-data"} (\S+)$',
        get(f"{url}/metrics")[1].decode(),
        flags=re.M,
    )
    return found and found[1]


def test_a_full_disk_pauses_the_sink_and_it_resumes_losing_nothing(
    settings_for: Callable[..., Settings], tmp_path: Path, small_disk: Path
) -> None:
    """While paused the sink's lag and its paused gauge show on /metrics and /readyz
    fails output_writable (a stalled sink is not silent)."""
    out = small_disk / "out"
    port = free_port()
    settings = settings_for(
        f"sink.output_dir={out}", "sink.rotate_records=50", "http.enabled=true", f"http.port={port}"
    )
    url, episodes = f"http://127.0.0.1:{port}", settings.topics.episodes
    publish(settings, [message(episode(i)) for i in range(100)])
    with Worker(settings, tmp_path / "worker.log") as worker:
        wait_for(lambda: sum(prompts(out).values()) == 100, timeout=60, what="first 100")
        wait_for(lambda: get(f"{url}/metrics")[0] == 200, timeout=30, what="/metrics")
        wait_for(lambda: sink_lag(url, episodes) == 0, timeout=30, what="no sink lag")
        filler = fill(small_disk)
        publish(settings, [message(episode(i)) for i in range(100, 600)])
        wait_for(lambda: "pausing consumption" in worker.log(), timeout=30, what="a pause")
        assert sum(prompts(out).values()) < 600
        lag = wait_for(
            lambda: (sink_lag(url, episodes) or 0) >= 400 and sink_lag(url, episodes),
            timeout=30,
            what="the paused sink's lag on /metrics",
        )
        assert lag is not None and lag <= 500
        wait_for(lambda: gauge(url) == "1.0", timeout=30, what="sink_paused 1")
        wait_for(
            lambda: (
                get(f"{url}/readyz")[0] == 503
                and not json.loads(get(f"{url}/readyz")[1])["checks"]["output_writable"]
            ),
            timeout=30,
            what="/readyz: output not writable",
        )
        active = (out / "training-data.jsonl").read_bytes()
        assert not active or active.endswith(b"\n")
        filler.unlink()
        wait_for(lambda: "resuming" in worker.log(), timeout=30, what=f"resume\n{worker.log()}")
        expected = Counter(f"task {i}" for i in range(600))
        wait_for(lambda: prompts(out) == expected, timeout=60, what="all 600 exactly once")
        wait_for(lambda: sink_lag(url, episodes) == 0, timeout=30, what="the lag gone again")
        assert gauge(url) == "0.0"
    assert "no_space" in worker.log()
