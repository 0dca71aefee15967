"""Structured logging: one line per event, ``key=value`` text or JSON (``worker.log_json``).

Every line is one event, whatever the message: newlines in messages and
tracebacks are escaped, so log shippers never split an event. Every secret
setting's value (the SASL password, API keys) is replaced by ``***`` in every
line as a last line of defence. Record contents (prompts, completions) are never
logged at info level: callers log ids, counts and reasons, and ``event`` makes
that the easy path.

Repeated warnings are rate-limited (:class:`RepeatFilter`, on the one handler, so
it covers every logger, aiokafka's, Faust's and mode's too): while the broker is
away, aiokafka logs the same few connection errors many times a second.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

import msgspec

from stream_export.settings import Settings
from stream_export.settings.values import Secret

LEVELS = {"debug": "DEBUG", "info": "INFO", "warn": "WARNING", "error": "ERROR"}
REDACTED = "***"
#: A warning (or worse) with the same logger, level and message template as one
#: logged less than this many seconds ago is dropped and counted; the next one
#: that is logged carries ``suppressed=N``.
REPEAT_WINDOW_S = 10.0
#: Causes remembered before quiet ones (no line for a window) are forgotten.
_MAX_CAUSES = 1024
#: Attributes every LogRecord has; anything else was passed through ``extra``.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def event(logger: logging.Logger, name: str, /, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event: a short dotted name plus fields (ids, counts, reasons; no contents)."""
    logger.log(level, name, extra=fields)


class RepeatFilter(logging.Filter):
    """At most one line per cause (logger, level, message template) per window.

    Only WARNING and above are limited; info lines are rare and carry state
    changes. Thread-safe: Faust's consumer logs from its own thread.
    """

    def __init__(self, window_s: float = REPEAT_WINDOW_S, clock: Any = time.monotonic) -> None:
        super().__init__()
        self.window_s = window_s
        self.clock = clock
        self._lock = threading.Lock()
        #: cause -> (when its last line was let through, lines dropped since).
        self._seen: dict[tuple[str, int, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        cause = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            last, dropped = self._seen.get(cause, (None, 0))
            if last is not None and now - last < self.window_s:
                self._seen[cause] = (last, dropped + 1)
                return False
            self._seen[cause] = (now, 0)
            if len(self._seen) > _MAX_CAUSES:
                self._forget(now)
        if dropped:
            record.suppressed = dropped
        return True

    def _forget(self, now: float) -> None:
        quiet = [c for c, (last, _) in self._seen.items() if now - last >= self.window_s]
        for cause in quiet:
            del self._seen[cause]


#: Exceptions with which Faust's table recovery ends a step it waits on, when the
#: worker stops or a rebalance starts (``Recovery._wait``), by module and name:
#: the gateway logs through here too, without Faust.
_RECOVERY_ENDED = frozenset(
    {("faust.tables.recovery", "ServiceStopped"), ("faust.tables.recovery", "RebalanceAgain")}
)


class RecoveryEndedFilter(logging.Filter):
    """asyncio's "Task exception was never retrieved" for a recovery step Faust left
    running when it ended it (:data:`_RECOVERY_ENDED`) becomes one info line: as an
    error with a traceback, every stop during a recovery looked like a crash."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if record.name == "asyncio" and exc is not None:
            kind = type(exc)
            if (kind.__module__, kind.__qualname__) in _RECOVERY_ENDED:
                record.levelno, record.levelname = logging.INFO, "INFO"
                record.msg, record.args = "faust: a table recovery step ended: %s", (kind.__name__,)
                record.exc_info = record.exc_text = None
        return True


class _Formatter(logging.Formatter):
    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets = [s for s in secrets if s]

    def scrub(self, text: str) -> str:
        for secret in self.secrets:
            text = text.replace(secret, REDACTED)
        return text

    @staticmethod
    def fields(record: logging.LogRecord) -> dict[str, Any]:
        return {k: v for k, v in vars(record).items() if k not in _STANDARD}

    @staticmethod
    def timestamp(record: logging.LogRecord) -> str:
        seconds = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        return f"{seconds}.{int(record.msecs):03d}Z"

    def exception(self, record: logging.LogRecord) -> str | None:
        if record.exc_info:
            return self.formatException(record.exc_info)
        return record.exc_text or None


class JsonFormatter(_Formatter):
    """``{"ts", "level", "logger", "msg", **fields, "exc"}`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "ts": self.timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in self.fields(record).items():
            line.setdefault(key, value)
        exc = self.exception(record)
        if exc:
            line["exc"] = exc
        return self.scrub(json.dumps(line, default=str, ensure_ascii=False))


class TextFormatter(_Formatter):
    """``TIME LEVEL logger: message key=value ...`` on one line."""

    def format(self, record: logging.LogRecord) -> str:
        parts = [
            self.timestamp(record),
            record.levelname,
            f"{record.name}:",
            record.getMessage(),
        ]
        parts += [f"{k}={_value(v)}" for k, v in self.fields(record).items()]
        exc = self.exception(record)
        if exc:
            parts.append(f"exc={json.dumps(exc)}")
        return self.scrub(" ".join(parts).replace("\n", "\\n"))


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return json.dumps(text) if not text or any(c in text for c in ' "=\n') else text


def secrets(settings: Settings) -> list[str]:
    """Values that must never appear in a log line: every Secret setting, whatever
    its section, and the SASL password from its file."""
    found = [settings.sasl_password()]
    for section in msgspec.structs.fields(settings):
        values = getattr(settings, section.name)
        found += [getattr(values, f.name) for f in msgspec.structs.fields(values)]
    return sorted({secret.reveal() for secret in found if isinstance(secret, Secret)})


def logging_config(settings: Settings) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dict: one handler on stderr, our formatter,
    repeated warnings rate-limited."""
    formatter = JsonFormatter if settings.worker.log_json else TextFormatter
    level = LEVELS[settings.worker.log_level]
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "structured": {
                "()": f"{formatter.__module__}.{formatter.__qualname__}",
                "secrets": secrets(settings),
            }
        },
        "filters": {
            name: {"()": f"{kind.__module__}.{kind.__qualname__}"}
            for name, kind in (("recovery_ended", RecoveryEndedFilter), ("repeats", RepeatFilter))
        },
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "structured",
                # In this order: a demoted line is not limited as an error.
                "filters": ["recovery_ended", "repeats"],
            }
        },
        "root": {"level": level, "handlers": ["stderr"]},
    }
