"""Wire the pipeline into one Faust worker: steps -> assemble -> episodes -> sink."""

from __future__ import annotations

import faust

from stream_export import assemble, sink
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


def run(settings: Settings) -> None:
    app = build(settings)
    worker = faust.Worker(app, loglevel=settings.worker.log_level, quiet=True)
    worker.execute_from_commandline()
