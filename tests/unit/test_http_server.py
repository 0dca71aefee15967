"""The HTTP server thread on its own: snapshots served as published, a stale one
reported as a stuck loop, every request paced, a taken port, a clean stop."""

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
    """What the worker loop would publish, set by the test."""

    def __init__(self) -> None:
        self.current = snapshot()

    def __call__(self) -> http.Snapshot:
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


def test_a_port_in_use_is_a_startup_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = http.Server("127.0.0.1", port, Metrics().registry, Published(), "")
        with pytest.raises(StartupError) as info:
            asyncio.run(server.start())
    assert str(info.value) == (
        f"http_port: cannot listen on 127.0.0.1:{port} (http.host, http.port): Address already "
        "in use; stop the process using it or choose another http.port"
    )
    assert server.thread is not None
    server.thread.join(5)
    assert not server.thread.is_alive()
