"""The HTTP server threads on their own: snapshots served as published, a stale one
reported as a stuck loop, every request paced, the probe port's probes answered
within a second while other clients flood both ports, a taken port, a clean stop."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator

import msgspec
import pytest

from stream_export.errors import StartupError
from stream_export.ops import http
from stream_export.runtime.metrics import Metrics
from tests.support.monitoring import free_port, get
from tests.support.probing import probes_under_flood


def snapshot(*, ready: bool = True, age: float = 0.0) -> http.Snapshot:
    checks = {"partitions_assigned": ready, "state_recovered": True, "output_writable": True}
    return http.Snapshot(
        taken=time.monotonic() - age,
        ready=ready,
        checks=checks,
        readyz=msgspec.json.encode({"ready": ready, "checks": checks}),
        status=b'{"worker_id": "w1"}',
    )


class Published:
    """What the worker loop would publish, set by the test; ``live``: taken just now,
    as from a worker loop that keeps publishing."""

    def __init__(self) -> None:
        self.current = snapshot()
        self.live = False

    def __call__(self) -> http.Snapshot:
        if self.live:
            return msgspec.structs.replace(self.current, taken=time.monotonic())
        return self.current


@pytest.fixture
def served() -> Iterator[tuple[str, Published, http.Server]]:
    published = Published()
    metrics = Metrics()
    metrics.records_written.inc(7)
    port = free_port()
    server = http.Server("127.0.0.1", port, metrics.registry, published, "<html>page</html>")
    asyncio.run(server.start())
    try:
        yield f"http://127.0.0.1:{port}", published, server
    finally:
        asyncio.run(server.stop())
        assert server.thread is not None and not server.thread.is_alive()


@pytest.fixture
def probe_url(served: tuple[str, Published, http.Server]) -> Iterator[str]:
    """A ProbeServer beside the ``served`` Server, on the same published snapshot."""
    _, published, _ = served
    port = free_port()
    server = http.ProbeServer("127.0.0.1", port, published)
    asyncio.run(server.start())
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run(server.stop())
        assert server.thread is not None and not server.thread.is_alive()


def test_serves_the_published_snapshot_and_the_registry(
    served: tuple[str, Published, http.Server],
) -> None:
    url, published, _ = served
    assert get(f"{url}/healthz") == (200, b'{"status":"alive"}')
    status, body = get(f"{url}/readyz")
    assert status == 200 and json.loads(body)["ready"] is True
    assert get(f"{url}/status.json") == (200, b'{"worker_id": "w1"}')
    assert get(f"{url}/") == (200, b"<html>page</html>")
    status, body = get(f"{url}/metrics")
    assert status == 200 and b"stream_export_records_written_total 7.0" in body
    published.current = snapshot(ready=False)
    status, body = get(f"{url}/readyz")
    assert status == 503 and json.loads(body)["checks"]["partitions_assigned"] is False


def test_a_stale_snapshot_means_the_worker_loop_is_stuck(
    served: tuple[str, Published, http.Server],
) -> None:
    url, published, _ = served
    published.current = snapshot(age=http.STALE_S + 3)
    status, body = get(f"{url}/healthz")
    assert status == 503 and json.loads(body)["status"] == "stuck"
    assert json.loads(body)["silent_s"] >= http.STALE_S + 3
    status, body = get(f"{url}/readyz")
    assert status == 503 and json.loads(body)["ready"] is False
    assert get(f"{url}/metrics")[0] == 200  # the registry does not depend on the loop
    published.current = snapshot()
    assert get(f"{url}/healthz")[0] == 200


def test_every_request_is_paced_unknown_paths_too(
    served: tuple[str, Published, http.Server],
) -> None:
    url, _, server = served
    n = server.other.burst + 20
    began = time.monotonic()
    assert {get(f"{url}/no-such-page")[0] for _ in range(n)} == {404}
    assert time.monotonic() - began >= (n - server.other.burst - 1) / http.MAX_REQUESTS_PER_S


def test_the_probe_port_serves_the_probes_only(
    served: tuple[str, Published, http.Server], probe_url: str
) -> None:
    _, published, _ = served
    assert get(f"{probe_url}/healthz") == (200, b'{"status":"alive"}')
    status, body = get(f"{probe_url}/readyz")
    assert status == 200 and json.loads(body)["ready"] is True
    published.current = snapshot(ready=False)
    status, body = get(f"{probe_url}/readyz")
    assert status == 503 and json.loads(body)["checks"]["partitions_assigned"] is False
    published.current = snapshot(age=http.STALE_S + 3)
    status, body = get(f"{probe_url}/healthz")
    assert status == 503 and json.loads(body)["status"] == "stuck"
    for path in ("/metrics", "/status.json", "/"):
        assert get(f"{probe_url}{path}")[0] == 404, path


def test_probes_on_the_probe_port_answer_within_a_second_under_a_flood(
    served: tuple[str, Published, http.Server], probe_url: str
) -> None:
    """Another client floods /healthz and /readyz on both ports at 30/s each: on the
    main port it exhausts the budget every client shares (its own requests wait
    past its 1 s timeout, as a kubelet's would there), on the probe port only its
    own; the kubelet's probes there are answered at once, every one."""
    url, published, _ = served
    published.live = True  # the test outlasts STALE_S
    answers, (main, own) = asyncio.run(
        probes_under_flood([url, probe_url], probe_url, rate=30, warm_up_s=1.0, probes=16)
    )
    assert main.timed_out > main.sent / 2, main
    assert own.timed_out > own.sent / 2, own
    assert [a.path for a in answers] == ["/healthz", "/readyz"] * 8
    late = [a for a in answers if a.status != 200 or a.took_s >= 1.0]
    assert not late, late
    assert {a.body for a in answers if a.path == "/healthz"} == {b'{"status":"alive"}'}
    assert {json.loads(a.body)["ready"] for a in answers if a.path == "/readyz"} == {True}


def test_idle_clients_are_forgotten() -> None:
    clients = http.PerClient(http.PROBE_REQUESTS_PER_S)
    pacers = [clients.get(f"10.0.0.{i}") for i in range(clients.sweep_at)]
    pacers[3].next_at = time.monotonic() + 5  # still has requests waiting
    assert len(clients.pacers) == 64
    clients.get("10.0.1.1")
    assert clients.pacers == {"10.0.0.3": pacers[3], "10.0.1.1": clients.get("10.0.1.1")}
    assert clients.get("10.0.0.3") is pacers[3]


@pytest.mark.parametrize("setting", ["http.port", "http.probe_port"])
def test_a_port_in_use_is_a_startup_error(setting: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server: http.Listener = (
            http.Server("127.0.0.1", port, Metrics().registry, Published(), "")
            if setting == "http.port"
            else http.ProbeServer("127.0.0.1", port, Published())
        )
        with pytest.raises(StartupError) as info:
            asyncio.run(server.start())
    assert str(info.value) == (
        f"http_port: cannot listen on 127.0.0.1:{port} (http.host, {setting}): Address already "
        f"in use; stop the process using it or choose another {setting}"
    )
    assert server.thread is not None
    server.thread.join(5)
    assert not server.thread.is_alive()
