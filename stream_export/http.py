"""The worker's HTTP endpoints, served from inside the worker process (aiohttp).

/metrics       Prometheus exposition of the injected registry
/healthz       200 while the process and its event loop answer
/readyz        200 only when partitions are assigned, table state is
               recovered and the output is writable; 503 and the failing
               checks otherwise
/              a live status page (polls /status.json)
/status.json   throughput, lag, open episodes, errors, recent records
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

import faust
import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from stream_export import __version__, logs
from stream_export.lag import WorkerService

log = logging.getLogger(__name__)

#: Throughput on the status page is averaged over this many seconds.
RATE_WINDOW_S = 10.0
RECENT_RECORDS = 5
PREVIEW_CHARS = 160
_TAIL_BYTES = 64 * 1024


#: Sample name -> (labels, value) of every sample, read from the registry once.
Samples = dict[str, list[tuple[dict[str, str], float]]]

#: The families the status page reads (collecting only these skips the histograms).
STATUS_FAMILIES = (
    "stream_export_events_consumed",
    "stream_export_episodes_emitted",
    "stream_export_records_written",
    "stream_export_bytes_written",
    "stream_export_open_episodes",
    "stream_export_consumer_lag_messages",
    "stream_export_events_invalid",
    "stream_export_dead_letters",
    "stream_export_sink_errors",
    "stream_export_format_errors",
    "stream_export_sink_paused",
    "stream_export_last_write_timestamp_seconds",
)


PAUSED = "stream_export_sink_paused"


def collect(registry: CollectorRegistry, families: Iterable[str] = ()) -> Samples:
    """Every sample of ``registry`` (or of the named families only), by sample name."""
    names = list(families)
    source = registry.restricted_registry(_sample_names(names)) if names else registry
    out: Samples = {}
    for family in source.collect():
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _sample_names(families: list[str]) -> list[str]:
    return [f + suffix for f in families for suffix in ("", "_total")]


def total(samples: Samples, name: str) -> float:
    """Sum of every sample called ``name`` (all label values)."""
    return sum(v for _, v in samples.get(name, ()))


def by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for labels, v in samples.get(name, ()):
        if label in labels:
            out[labels[label]] = out.get(labels[label], 0.0) + v
    return out


def writable(directory: str) -> bool:
    """Whether the output directory (or the ancestor that will hold it) is a writable folder."""
    path = Path(directory).resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def readiness(
    *,
    assigned: bool,
    rebalancing: bool,
    recovered: bool,
    paused: float,
    writable: bool,
    kafka_reachable: bool,
) -> dict[str, bool]:
    """The four readiness checks; the worker is ready when all are true.

    ``kafka_reachable`` turns false once the broker has not answered for a while
    (see :mod:`stream_export.health`).
    """
    return {
        "partitions_assigned": assigned and not rebalancing,
        "state_recovered": recovered,
        "output_writable": paused == 0 and writable,
        "kafka_reachable": kafka_reachable,
    }


def recent_records(directory: str, n: int = RECENT_RECORDS) -> list[dict[str, Any]]:
    """The last ``n`` lines of the newest uncompressed output file, as short previews."""
    files = [p for p in Path(directory).rglob("*.jsonl") if p.is_file()]
    if not files:
        return []
    newest = max(files, key=lambda p: p.stat().st_mtime)
    with newest.open("rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        fh.seek(max(0, size - _TAIL_BYTES))
        tail = fh.read().split(b"\n")
    lines = [line for line in tail[1 if size > _TAIL_BYTES else 0 : -1] if line][-n:]
    return [
        {
            "file": newest.name,
            "bytes": len(line) + 1,
            "preview": line[: PREVIEW_CHARS * 4].decode("utf-8", "replace")[:PREVIEW_CHARS],
        }
        for line in reversed(lines)
    ]


class Throughput:
    """Per-second rates of a few counters over a sliding window."""

    COUNTERS: ClassVar[dict[str, str]] = {
        "events_per_s": "stream_export_events_consumed_total",
        "records_per_s": "stream_export_records_written_total",
        "bytes_per_s": "stream_export_bytes_written_total",
    }

    def __init__(self, registry: CollectorRegistry, window_s: float = RATE_WINDOW_S) -> None:
        self.registry, self.window_s = registry, window_s
        self.points: deque[tuple[float, dict[str, float]]] = deque()

    def sample(self, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        samples = collect(self.registry, [n.removesuffix("_total") for n in self.COUNTERS.values()])
        self.points.append((now, {k: total(samples, n) for k, n in self.COUNTERS.items()}))
        while len(self.points) > 2 and now - self.points[1][0] >= self.window_s:
            self.points.popleft()

    def rates(self) -> dict[str, float]:
        if len(self.points) < 2:
            return dict.fromkeys(self.COUNTERS, 0.0)
        (t0, first), (t1, last) = self.points[0], self.points[-1]
        return {k: round((last[k] - first[k]) / (t1 - t0), 3) for k in self.COUNTERS}


def recovered(app: faust.App) -> bool:
    """Table state is recovered from the changelog (and no new recovery is running)."""
    recovery: Any = getattr(app.tables, "recovery", None)
    return recovery is not None and recovery.completed.is_set() and not app.in_recovery


class HttpService(WorkerService):
    """Serves the endpoints above; a mode Service started with the Faust worker."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.registry = self.metrics.registry
        self.throughput = Throughput(self.registry)
        self.started_at = time.time()
        self.was_ready = False
        self.runner: web.AppRunner | None = None
        page = resources.files("stream_export").joinpath("status.html")
        self.page = page.read_text(encoding="utf-8")

    def web_app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.handle_metrics)
        app.router.add_get("/healthz", self.handle_healthz)
        app.router.add_get("/readyz", self.handle_readyz)
        app.router.add_get("/status.json", self.handle_status)
        app.router.add_get("/", self.handle_page)
        return app

    async def on_start(self) -> None:
        self.runner = web.AppRunner(self.web_app(), access_log=None)
        await self.runner.setup()
        h = self.settings.http
        await web.TCPSite(self.runner, h.host, h.port).start()
        logs.event(log, "http.started", host=h.host, port=h.port)

    async def on_stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    @faust.Service.timer(1.0)
    async def _tick(self) -> None:
        self.throughput.sample()
        checks = self.checks()
        ready = all(checks.values())
        if ready != self.was_ready:
            self.was_ready = ready
            logs.event(log, "worker.ready" if ready else "worker.not_ready", **checks)

    def checks(self) -> dict[str, bool]:
        reachable = "stream_export_kafka_reachable"  # set by health.KafkaProbe
        return readiness(
            assigned=bool(self.assignment.partitions),
            rebalancing=self.app.rebalancing,
            recovered=recovered(self.app),
            paused=total(collect(self.registry, [PAUSED]), PAUSED),
            writable=writable(self.settings.sink.output_dir),
            kafka_reachable=total(collect(self.registry, [reachable]), reachable) > 0,
        )

    def status(self) -> dict[str, Any]:
        r = collect(self.registry, STATUS_FAMILIES)
        checks = self.checks()
        last_write = total(r, "stream_export_last_write_timestamp_seconds")
        lag = [
            {"topic": labels["topic"], "partition": int(labels["partition"]), "messages": v}
            for labels, v in r.get("stream_export_consumer_lag_messages", ())
        ]
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
            "lag": sorted(lag, key=lambda x: (x["topic"], x["partition"])),
            "lag_total": sum(x["messages"] for x in lag),
            "errors": {
                "invalid": by_label(r, "stream_export_events_invalid_total", "reason"),
                "dead_letters": by_label(r, "stream_export_dead_letters_total", "reason"),
                "sink": by_label(r, "stream_export_sink_errors_total", "kind"),
                "format": total(r, "stream_export_format_errors_total"),
            },
            "last_write_age_s": round(time.time() - last_write, 1) if last_write else None,
            "recent_records": recent_records(self.settings.sink.output_dir),
        }

    async def handle_metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def handle_healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "alive"})

    async def handle_readyz(self, request: web.Request) -> web.Response:
        checks = self.checks()
        ready = all(checks.values())
        return web.json_response({"ready": ready, "checks": checks}, status=200 if ready else 503)

    async def handle_status(self, request: web.Request) -> web.Response:
        return web.Response(
            body=msgspec.json.encode(self.status()),
            content_type="application/json",
            headers={"Cache-Control": "no-store"},
        )

    async def handle_page(self, request: web.Request) -> web.Response:
        return web.Response(
            text=self.page,
            content_type="text/html",
            headers={"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"},
        )
