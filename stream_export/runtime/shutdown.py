"""Stop the worker on purpose: one clear log line, a clean stop, exit code 2.

An exception raised inside Faust's services is logged as a crash with a
traceback, which buries what an operator must do. For a condition the operator
has to resolve (a topic reset, say), :func:`stop` logs the error as one line,
remembers it, and asks the worker to stop the way an operator would (SIGTERM:
Faust's clean shutdown); :func:`stream_export.ops.worker.run` then exits with 2, like
the command line's other errors. One worker per process, so the state is the
process's.
"""

from __future__ import annotations

import logging
import os
import signal

from stream_export.errors import StreamExportError

log = logging.getLogger(__name__)

_errors: list[StreamExportError] = []


def stop(error: StreamExportError) -> None:
    """Log ``error`` and stop this worker; later calls (another table, say, while
    it stops) only log at info level, so the reason stays one error line."""
    if _errors:
        log.info("stream-export: also %s", error)
        return
    log.error("stream-export: %s", error)
    _errors.append(error)
    os.kill(os.getpid(), signal.SIGTERM)


def reason() -> StreamExportError | None:
    """The error the worker was stopped for, if any."""
    return _errors[0] if _errors else None
