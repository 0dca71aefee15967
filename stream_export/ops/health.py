"""Whether the broker answers, for ``/readyz``: a cheap probe every few seconds.

The probe opens one connection with the configured security
(:func:`~stream_export.kafka.connection.check_kafka`) and closes it; the Kafka clients
themselves keep retrying on their own. When no probe has succeeded for
:data:`UNREACHABLE_AFTER_S`, ``stream_export_kafka_reachable`` drops to 0 and the
``kafka_reachable`` readiness check fails (``/readyz`` 503) until a probe
succeeds again. A short blip (a broker restart) does not flip readiness. A probe
that fails otherwise (no file descriptor left, say) counts as no answer: it is
counted, and never ends the worker.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import faust

from stream_export.errors import AuthenticationError, KafkaUnavailableError
from stream_export.kafka.connection import check_kafka
from stream_export.runtime.lag import WorkerService
from stream_export.telemetry import logs

#: Seconds between probes, and the longest a probe waits for an answer.
PROBE_INTERVAL_S = 5.0
#: Without an answer for this long the broker counts as unreachable. With the
#: probe interval, /readyz turns 503 15-25 s after the broker goes away and
#: back to 200 at most PROBE_INTERVAL_S after it returns.
UNREACHABLE_AFTER_S = 15.0

log = logging.getLogger(__name__)


def reachable(last_answer: float | None, now: float, after_s: float = UNREACHABLE_AFTER_S) -> bool:
    """Whether a broker answer at ``last_answer`` (monotonic; None: never) is recent."""
    return last_answer is not None and now - last_answer < after_s


class KafkaProbe(WorkerService):
    """Probes the broker with the worker and keeps ``metrics.kafka_reachable`` current."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.last_answer: float | None = None
        self.was_reachable = True

    async def on_start(self) -> None:
        await self.probe()

    @faust.Service.timer(PROBE_INTERVAL_S)
    async def _probe(self) -> None:
        await self.probe()

    async def probe(self) -> None:
        error: str | None = None
        try:
            await check_kafka(self.settings, within_s=PROBE_INTERVAL_S)
        except (KafkaUnavailableError, AuthenticationError) as exc:
            error = exc.reason
        except Exception as exc:  # no answer, counted; never ends the worker
            error = type(exc).__name__
            self.metrics.service_errors.labels("kafka_probe").inc()
        else:
            self.last_answer = time.monotonic()
        now = time.monotonic()
        ok = reachable(self.last_answer, now)
        self.metrics.kafka_reachable.set(1 if ok else 0)
        if ok != self.was_reachable:
            self.was_reachable = ok
            if ok:
                logs.event(log, "kafka.reachable")
            else:
                silent = round(now - self.last_answer, 1) if self.last_answer is not None else None
                logs.event(log, "kafka.unreachable", logging.WARNING, error=error, silent_s=silent)
