"""Wire the pipeline into one Faust worker: steps -> assemble -> episodes -> sink."""

from __future__ import annotations

import faulthandler
import logging
import sys
from typing import Any

import faust

from stream_export.assemble import agent as assemble
from stream_export.errors import StreamExportError
from stream_export.groups import stage as group_stage
from stream_export.output import card, score_rows, sink
from stream_export.runtime import shutdown
from stream_export.runtime.app import create_app, declare_topics
from stream_export.runtime.metrics import Metrics
from stream_export.runtime.patches import worker as patched
from stream_export.settings import Settings
from stream_export.telemetry import logs

log = logging.getLogger(__name__)


def build(settings: Settings, metrics: Metrics | None = None) -> faust.App:
    metrics = metrics or Metrics()
    app = create_app(settings)
    topics = declare_topics(app, settings)
    assemble.attach(app, topics, settings, metrics)
    sink.attach(app, topics, settings, metrics)
    app.add_dependency(card.Service(settings))
    if settings.scores.enabled:
        score_rows.attach(app, topics, settings, metrics)
    if settings.groups.enabled:
        group_stage.attach(app, topics, settings, metrics)
    return app


def services(app: faust.App, settings: Settings, metrics: Metrics) -> list[faust.Service]:
    """The operations services started with the worker: HTTP endpoints, lag updates
    and the broker probe behind the kafka_reachable readiness check."""
    if not settings.http.enabled:
        return []
    from stream_export.ops.health import KafkaProbe
    from stream_export.ops.http import HttpService
    from stream_export.runtime.lag import Assignment, LagMonitor

    assignment = Assignment(app, settings)
    return [
        HttpService(app, settings, metrics, assignment),
        LagMonitor(app, settings, metrics, assignment),
        KafkaProbe(app, settings, metrics, assignment),
    ]


class _Fatal(logging.Filter):
    """Keeps the first of our own errors that stopped the worker, and drops its crash log.

    mode logs a crashed service with its traceback (and Faust adds "We experienced
    a crash"); an error we raise on purpose (output locked by another worker, port
    taken) already says what to do, so ``run`` raises it for the CLI to print as
    one line instead.
    """

    CRASH_LOGS = ("Crashed reason=%r", "Error: %r")

    def __init__(self) -> None:
        super().__init__()
        self.error: StreamExportError | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, StreamExportError) and str(record.msg).endswith(self.CRASH_LOGS):
            self.error = self.error or exc
            return False
        return True


class Worker(patched.Worker):
    """Faust's worker (with a prompt end: see patches.worker), raising our own fatal
    errors instead of logging a crash (see _Fatal), whose stop ends within
    ``stop_deadline_s`` whatever it waits for."""

    def __init__(self, *args: Any, stop_deadline_s: float, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.fatal = _Fatal()
        self.stop_deadline_s = stop_deadline_s
        self._deadline_armed = False

    async def stop(self) -> None:
        """Stop, with faulthandler's watchdog armed: a C thread that, if the process
        is still here at the deadline, prints every thread's stack and exits 1. It
        fires even with the event loop blocked, or with the interpreter waiting at
        exit for a thread that never ends; what the stop left undone is handled
        again on restart, as after a kill -9."""
        if not self._deadline_armed:
            self._deadline_armed = True
            # The process's own stderr: mode replaces sys.stderr with a logging
            # proxy that has no file descriptor. Whatever fails here must not
            # keep the stop itself from running.
            try:
                faulthandler.dump_traceback_later(
                    self.stop_deadline_s, exit=True, file=sys.__stderr__ or sys.stderr
                )
            except (OSError, ValueError, AttributeError, RuntimeError) as exc:
                log.warning("worker: no stop deadline (%s)", exc)
        await super().stop()

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        super().on_setup_root_logger(logger, level)
        for handler in logger.handlers:
            handler.addFilter(self.fatal)

    def stop_and_shutdown(self) -> None:
        if self.fatal.error is not None:
            self.crash_reason = None  # raised by run() instead, without the crash log
        super().stop_and_shutdown()


def run(settings: Settings) -> None:
    """Run the worker until it is stopped; a StreamExportError that stopped it is raised."""
    metrics = Metrics()
    app = build(settings, metrics)
    worker = Worker(
        app,
        *services(app, settings, metrics),
        loglevel=settings.worker.log_level,
        logging_config=logs.logging_config(settings),
        quiet=True,
        stop_deadline_s=settings.worker.stop_deadline_s,
    )
    try:
        worker.execute_from_commandline()
    except SystemExit:
        if worker.fatal.error is not None:
            raise worker.fatal.error from None
        if shutdown.reason() is not None:
            raise SystemExit(2) from None  # stopped on purpose; the reason is logged
        raise
