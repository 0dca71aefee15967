"""The worker's HTTP endpoints, served from inside the worker process (aiohttp).

/metrics       Prometheus exposition of the injected registry
/healthz       200 while the worker's event loop answers; 503 when it has not
               published a snapshot for STALE_S seconds (loop stuck)
/readyz        200 only when partitions are assigned, table state is
               recovered, the output is writable and the broker answers
               (kafka_reachable); 503 and the failing checks otherwise
/              a live status page (polls /status.json)
/status.json   throughput, lag (assembler and sink), open episodes, errors (total
               and over the last ERROR_WINDOW_S), sealed files, disk space,
               recent records (with http.record_previews only), and the groups
               stage's numbers when it runs (see stream_export.ops.status); raw
               numbers (seconds, bytes) for scripts, the page humanises them

Every answer, of either port and 404s too, carries SECURITY_HEADERS; the page's
Content-Security-Policy admits only its own inline script and style (by hash)
and requests to this origin.

The server runs on its own thread and event loop, so no number of clients can
take time from the pipeline's loop: the worker loop computes the checks and
the status document once a second and publishes them as an immutable
Snapshot of encoded bytes; the HTTP thread only serves those bytes, and
/metrics from the (thread-safe) registry, at most once per METRICS_MAX_AGE_S.
Requests are paced to MAX_REQUESTS_PER_S per endpoint; more wait their turn,
so a flood queues on the HTTP thread (costing the interpreter a few percent)
instead of contending with the pipeline for it.

That shared budget is what any client can exhaust, so the orchestrator's probes
have a port of their own (``http.probe_port``): a ProbeServer on a second thread
serving only /healthz and /readyz, paced per client address. The kubelet is one
client there; another client's flood, on either port, delays only that client.
"""

from __future__ import annotations

import asyncio
import base64
import concurrent.futures
import hashlib
import logging
import math
import re
import threading
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import faust
import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from stream_export import __version__
from stream_export.ops.preflight import port_in_use
from stream_export.ops.status import (
    ERROR_FAMILIES,
    ERROR_WINDOW_S,
    GROUP_FAMILIES,
    PAUSED,
    STATUS_FAMILIES,
    UPLOAD_PAUSED,
    Disk,
    SealedFiles,
    Throughput,
    Window,
    collect,
    disk_space,
    error_counts,
    error_rows,
    groups,
    recent_records,
    total,
    writable,
)
from stream_export.runtime.lag import WorkerService
from stream_export.telemetry import logs

log = logging.getLogger(__name__)

#: The worker loop publishes a snapshot this often; /healthz and /readyz turn 503
#: when the newest one is older than STALE_S (the loop is stuck).
SNAPSHOT_EVERY_S = 1.0
STALE_S = 5.0
#: Requests answered per second at most, per endpoint (and for all other paths
#: together); more wait their turn. Far above what Prometheus, probes and a few
#: status pages ask for; a flood on one endpoint does not delay the others.
MAX_REQUESTS_PER_S = 10.0
#: On the probe port: requests answered per second at most, per client address.
PROBE_REQUESTS_PER_S = 10.0
#: Requests waiting their turn are let go together, on a grid of this many seconds.
PACE_QUANTUM_S = 0.25
#: /metrics is rendered from the registry at most this often.
METRICS_MAX_AGE_S = 1.0
#: How long stopping waits for open requests before closing them.
SHUTDOWN_S = 1.0


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
PATHS = ("/metrics", "/healthz", "/readyz", "/status.json", "/")

#: On every answer: no framing, no MIME sniffing, no referrer; and a policy that
#: loads nothing (the page's own, see ``page_policy``, admits its inline code).
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}


def page_policy(page: str) -> str:
    """The Content-Security-Policy of a page whose only code is its inline
    ``<script>`` and ``<style>`` elements: those, by hash, and fetches of this origin."""

    def hashes(tag: str) -> str:
        bodies = re.findall(rf"<{tag}>(.*?)</{tag}>", page, flags=re.S)
        digests = (hashlib.sha256(body.encode()).digest() for body in bodies)
        return " ".join(f"'sha256-{base64.b64encode(d).decode()}'" for d in digests)

    return (
        f"{SECURITY_HEADERS['Content-Security-Policy']}; connect-src 'self'; "
        f"script-src {hashes('script')}; style-src {hashes('style')}"
    )


def readiness(
    *,
    assigned: bool,
    rebalancing: bool,
    recovered: bool,
    paused: float,
    writable: bool,
    kafka_reachable: bool,
    upload_paused: float = 0.0,
) -> dict[str, bool]:
    """The readiness checks; the worker is ready when all are true.

    ``kafka_reachable`` turns false once the broker has not answered for a while
    (see :mod:`stream_export.ops.health`).
    """
    return {
        "partitions_assigned": assigned and not rebalancing,
        "state_recovered": recovered,
        "output_writable": paused == 0 and writable,
        "kafka_reachable": kafka_reachable,
        "uploads_flowing": upload_paused == 0,
    }


def recovered(app: faust.App) -> bool:
    """Table state is recovered from the changelog (and no new recovery is running)."""
    recovery: Any = getattr(app.tables, "recovery", None)
    return recovery is not None and recovery.completed.is_set() and not app.in_recovery


class Snapshot(msgspec.Struct, frozen=True):
    """What the worker loop last published for the HTTP thread (replaced, never changed)."""

    #: time.monotonic() when it was taken
    taken: float
    ready: bool
    checks: dict[str, bool]
    #: the encoded /readyz and /status.json bodies
    readyz: bytes
    status: bytes

    def age(self) -> float:
        return time.monotonic() - self.taken


class Pacer:
    """Spaces callers of ``wait`` at least 1/rate apart (a burst of ``burst`` first).

    Waiters are let go together on a grid of ``quantum`` seconds: every wake-up
    of the HTTP thread takes the interpreter lock from the worker's thread (on a
    busy machine each hand-over costs it a scheduling delay), so a queue is
    served in a few wake-ups a second rather than one per request.
    """

    def __init__(self, rate: float, burst: int = 20, quantum: float = PACE_QUANTUM_S) -> None:
        self.interval = 1.0 / rate
        self.burst = burst
        self.quantum = quantum
        self.next_at = 0.0

    async def wait(self) -> None:
        now = time.monotonic()
        at = max(self.next_at, now - self.burst * self.interval)
        self.next_at = at + self.interval
        if at > now:
            await asyncio.sleep(math.ceil(at / self.quantum) * self.quantum - now)

    def idle(self, now: float) -> bool:
        """Whether it has its whole burst back: a new Pacer would behave the same."""
        return self.next_at <= now - self.burst * self.interval


class PerClient:
    """A Pacer per client address, so a client that floods delays only itself.

    Idle pacers are forgotten whenever the table has doubled since the last sweep,
    so many short-lived clients cost memory only while they are active.
    """

    def __init__(self, rate: float) -> None:
        self.rate = rate
        self.pacers: dict[str, Pacer] = {}
        self.sweep_at = 64

    def get(self, client: str) -> Pacer:
        pacer = self.pacers.get(client)
        if pacer is None:
            if len(self.pacers) >= self.sweep_at:
                now = time.monotonic()
                self.pacers = {c: p for c, p in self.pacers.items() if not p.idle(now)}
                self.sweep_at = max(64, 2 * len(self.pacers))
            pacer = self.pacers[client] = Pacer(self.rate)
        return pacer


def _json(body: bytes, status: int = 200) -> web.Response:
    return web.Response(
        body=body,
        status=status,
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


class Listener:
    """aiohttp on its own thread and event loop, answering probes from the newest
    Snapshot; a subclass adds its routes and says whose turn a request waits for."""

    #: The setting that names the port (in the error when it cannot be listened on).
    port_setting = "http.port"
    thread_name = "stream-export-http"

    def __init__(self, host: str, port: int, snapshot: Callable[[], Snapshot]) -> None:
        self.host, self.port, self.snapshot = host, port, snapshot
        self.headers = dict(SECURITY_HEADERS)
        self.thread: threading.Thread | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stopping: asyncio.Event | None = None

    def routes(self) -> dict[str, Handler]:
        return {"/healthz": self.handle_healthz, "/readyz": self.handle_readyz}

    def pacer(self, request: web.Request) -> Pacer:
        raise NotImplementedError

    def web_app(self) -> web.Application:
        app = web.Application(middlewares=[self.paced])
        for path, handler in self.routes().items():
            app.router.add_get(path, handler)
        app.on_response_prepare.append(self.secure)
        return app

    async def secure(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every answer (errors too) carries the security headers."""
        response.headers.update(self.headers)

    @web.middleware
    async def paced(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every request, to any path (404s too), waits for its turn first."""
        await self.pacer(request).wait()
        return await handler(request)

    async def start(self) -> None:
        """Start the thread; return once it listens (StartupError when it cannot)."""
        listening: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.thread = threading.Thread(
            target=self._run, args=(listening,), name=self.thread_name, daemon=True
        )
        self.thread.start()
        await asyncio.wrap_future(listening)

    async def stop(self) -> None:
        """Close the server and wait for its thread to end."""
        if self.loop is not None and self.stopping is not None:
            self.loop.call_soon_threadsafe(self.stopping.set)
        if self.thread is not None:
            await asyncio.to_thread(self.thread.join, SHUTDOWN_S + 5)

    def _run(self, listening: concurrent.futures.Future[None]) -> None:
        # asyncio.run also cancels and awaits the requests still waiting their turn.
        asyncio.run(self._serve(listening))

    async def _serve(self, listening: concurrent.futures.Future[None]) -> None:
        runner = web.AppRunner(
            self.web_app(), access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_S
        )
        await runner.setup()
        try:
            await web.TCPSite(runner, self.host, self.port).start()
        except OSError as exc:
            await runner.cleanup()
            listening.set_exception(port_in_use(self.host, self.port, exc, self.port_setting))
            return
        self.loop, self.stopping = asyncio.get_running_loop(), asyncio.Event()
        listening.set_result(None)
        await self.stopping.wait()
        await runner.cleanup()

    async def handle_healthz(self, request: web.Request) -> web.Response:
        age = self.snapshot().age()
        if age <= STALE_S:
            return _json(b'{"status":"alive"}')
        return _json(msgspec.json.encode({"status": "stuck", "silent_s": round(age, 1)}), 503)

    async def handle_readyz(self, request: web.Request) -> web.Response:
        snap = self.snapshot()
        age = snap.age()
        if age <= STALE_S:
            return _json(snap.readyz, 200 if snap.ready else 503)
        stale = {"ready": False, "checks": snap.checks, "silent_s": round(age, 1)}
        return _json(msgspec.json.encode(stale), 503)


class Server(Listener):
    """The main port: every endpoint, each paced on its own (all clients share it)."""

    def __init__(
        self,
        host: str,
        port: int,
        registry: CollectorRegistry,
        snapshot: Callable[[], Snapshot],
        page: str,
    ) -> None:
        super().__init__(host, port, snapshot)
        self.registry = registry
        self.page = page.encode()
        self.headers["Content-Security-Policy"] = page_policy(page)
        self.pacers = {path: Pacer(MAX_REQUESTS_PER_S) for path in PATHS}
        self.other = Pacer(MAX_REQUESTS_PER_S)
        self.metrics_body, self.metrics_at = b"", float("-inf")

    def routes(self) -> dict[str, Handler]:
        return {
            "/metrics": self.handle_metrics,
            **super().routes(),
            "/status.json": self.handle_status,
            "/": self.handle_page,
        }

    def pacer(self, request: web.Request) -> Pacer:
        return self.pacers.get(request.path, self.other)

    async def handle_metrics(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        if now - self.metrics_at >= METRICS_MAX_AGE_S:
            self.metrics_body, self.metrics_at = generate_latest(self.registry), now
        return web.Response(body=self.metrics_body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_status(self, request: web.Request) -> web.Response:
        return _json(self.snapshot().status)

    async def handle_page(self, request: web.Request) -> web.Response:
        return web.Response(
            body=self.page,
            content_type="text/html",
            charset="utf-8",
            headers={"Cache-Control": "no-store"},
        )


class ProbeServer(Listener):
    """``http.probe_port``: /healthz and /readyz only, paced per client address."""

    port_setting = "http.probe_port"
    thread_name = "stream-export-probe"

    def __init__(self, host: str, port: int, snapshot: Callable[[], Snapshot]) -> None:
        super().__init__(host, port, snapshot)
        self.clients = PerClient(PROBE_REQUESTS_PER_S)

    def pacer(self, request: web.Request) -> Pacer:
        return self.clients.get(request.remote or "")


class HttpService(WorkerService):
    """Publishes a Snapshot from the worker loop every second and runs the Server
    thread (and the ProbeServer's, with http.probe_port); a mode Service started
    and stopped with the Faust worker."""

    snapshot: Snapshot

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.registry = self.metrics.registry
        self.throughput = Throughput(self.registry)
        self.errors = Window(ERROR_WINDOW_S)
        self.sealed = SealedFiles(self.settings.sink.output_dir, self.settings.sink.prefix)
        self.started_at = time.time()
        self.was_ready = False
        page = resources.files("stream_export.ops").joinpath("status.html")
        h = self.settings.http
        self.server = Server(
            h.host, h.port, self.registry, lambda: self.snapshot, page.read_text(encoding="utf-8")
        )
        self.listeners: list[Listener] = [self.server]
        if h.probe_port is not None:
            self.listeners.append(ProbeServer(h.host, h.probe_port, lambda: self.snapshot))

    async def on_start(self) -> None:
        self.snapshot = self.take(Disk(recent=None, sealed=self.sealed.summary(), space=None))
        for listener in self.listeners:
            await listener.start()
        h = self.settings.http
        logs.event(log, "http.started", host=h.host, port=h.port, probe_port=h.probe_port)

    async def on_stop(self) -> None:
        await asyncio.gather(*(listener.stop() for listener in self.listeners))
        alive = any(li.thread is not None and li.thread.is_alive() for li in self.listeners)
        logs.event(log, "http.stopped", thread_alive=alive)

    @faust.Service.timer(SNAPSHOT_EVERY_S)
    async def _tick(self) -> None:
        self.throughput.sample()
        self.errors.add(time.monotonic(), error_counts(collect(self.registry, ERROR_FAMILIES)))
        disk = await asyncio.to_thread(self.disk)
        if disk.error is not None:
            self.metrics.service_errors.labels("status").inc()
            logs.event(log, "status.unreadable", logging.WARNING, error=disk.error)
        self.snapshot = snap = self.take(disk)
        if snap.ready != self.was_ready:
            self.was_ready = snap.ready
            logs.event(log, "worker.ready" if snap.ready else "worker.not_ready", **snap.checks)

    def disk(self) -> Disk:
        """What the status page shows of the output folder (file I/O: in a thread).
        What cannot be read is reported in ``error`` and never raised: whatever
        the folder holds, the worker goes on."""
        sink = self.settings.sink
        errors: list[str] = []

        def read(part: Callable[[], Any], otherwise: Any) -> Any:
            try:
                return part()
            except Exception as exc:  # reported on the page and counted
                errors.append(f"{type(exc).__name__}: {exc}")
                return otherwise

        recent = None
        if self.settings.http.record_previews:
            recent = read(lambda: recent_records(sink.output_dir, sink.prefix), [])
        sealed = read(self.sealed.update, self.sealed.summary())
        space = disk_space(sink.output_dir)
        return Disk(recent, sealed, space, errors[0] if errors else None)

    def take(self, disk: Disk) -> Snapshot:
        """The checks and the status document now, encoded once for every reader."""
        checks = self.checks()
        ready = all(checks.values())
        return Snapshot(
            taken=time.monotonic(),
            ready=ready,
            checks=checks,
            readyz=msgspec.json.encode({"ready": ready, "checks": checks}),
            status=msgspec.json.encode(self.status(checks, disk)),
        )

    def checks(self) -> dict[str, bool]:
        reachable = "stream_export_kafka_reachable"  # set by health.KafkaProbe
        return readiness(
            assigned=bool(self.assignment.partitions),
            rebalancing=self.app.rebalancing,
            recovered=recovered(self.app),
            paused=total(collect(self.registry, [PAUSED]), PAUSED),
            writable=writable(self.settings.sink.output_dir),
            kafka_reachable=total(collect(self.registry, [reachable]), reachable) > 0,
            upload_paused=total(collect(self.registry, [UPLOAD_PAUSED]), UPLOAD_PAUSED),
        )

    def status(self, checks: dict[str, bool], disk: Disk) -> dict[str, Any]:
        grouping = self.settings.groups.enabled
        r = collect(self.registry, STATUS_FAMILIES + (GROUP_FAMILIES if grouping else ()))
        last_write = total(r, "stream_export_last_write_timestamp_seconds")
        lag = sorted(
            (labels["topic"], int(labels["partition"]), v)
            for labels, v in r.get("stream_export_consumer_lag_messages", ())
        )
        lag_total = sum(v for *_, v in lag)
        episodes = self.settings.topics.episodes
        sink_lag = sum(v for topic, _, v in lag if topic == episodes)
        return {
            "worker_id": self.settings.worker.worker_id,
            "version": __version__,
            "uptime_s": round(time.time() - self.started_at, 1),
            "ready": all(checks.values()),
            "checks": checks,
            "partitions": sorted(f"{tp.topic}/{tp.partition}" for tp in self.assignment.partitions),
            "throughput": self.throughput.rates(),
            "totals": {
                "events_consumed": total(r, "stream_export_events_consumed_total"),
                "episodes_emitted": total(r, "stream_export_episodes_emitted_total"),
                "records_written": total(r, "stream_export_records_written_total"),
                "bytes_written": total(r, "stream_export_bytes_written_total"),
            },
            "open_episodes": total(r, "stream_export_open_episodes"),
            "lag": [{"topic": t, "partition": p, "messages": v} for t, p, v in lag],
            "lag_total": lag_total,
            "lag_by_stage": {"assemble": lag_total - sink_lag, "sink": sink_lag},
            "lag_topics": {"assemble": self.settings.topics.steps, "sink": episodes},
            "errors": error_rows(error_counts(r), self.errors.increase(), self.errors.span()),
            "error_window_s": ERROR_WINDOW_S,
            "sink_paused": total(r, PAUSED) > 0,
            "last_write_age_s": round(time.time() - last_write, 1) if last_write else None,
            "sealed": disk.sealed,
            "disk": disk.space,
            "output_error": disk.error,
            "recent_records": disk.recent,
            "groups": groups(r) if grouping else None,
        }
