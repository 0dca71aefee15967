"""Wire the pipeline into one Faust worker: steps -> assemble -> episodes -> sink."""

from __future__ import annotations

import faust

from stream_export import assemble, logs, shutdown, sink
from stream_export.app import create_app, declare_topics
from stream_export.config import Settings
from stream_export.metrics import Metrics


def build(settings: Settings, metrics: Metrics | None = None) -> faust.App:
    metrics = metrics or Metrics()
    app = create_app(settings)
    topics = declare_topics(app, settings)
    assemble.attach(app, topics, settings, metrics)
    sink.attach(app, topics, settings, metrics)
    return app


def services(app: faust.App, settings: Settings, metrics: Metrics) -> list[faust.Service]:
    """The operations services started with the worker: HTTP endpoints, lag updates
    and the broker probe behind the kafka_reachable readiness check."""
    if not settings.http.enabled:
        return []
    from stream_export.health import KafkaProbe
    from stream_export.http import HttpService
    from stream_export.lag import Assignment, LagMonitor

    assignment = Assignment(app, settings)
    return [
        HttpService(app, settings, metrics, assignment),
        LagMonitor(app, settings, metrics, assignment),
        KafkaProbe(app, settings, metrics, assignment),
    ]


def run(settings: Settings) -> None:
    metrics = Metrics()
    app = build(settings, metrics)
    worker = faust.Worker(
        app,
        *services(app, settings, metrics),
        loglevel=settings.worker.log_level,
        logging_config=logs.logging_config(settings),
        quiet=True,
    )
    try:
        worker.execute_from_commandline()
    except SystemExit:
        if shutdown.reason() is not None:
            raise SystemExit(2) from None  # stopped on purpose; the reason is logged
        raise
