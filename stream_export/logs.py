"""Structured logging: one line per event, ``key=value`` text or JSON (``worker.log_json``).

Every line is one event, whatever the message: newlines in messages and
tracebacks are escaped, so log shippers never split an event. Known secrets
(the SASL password) are replaced by ``***`` in every line as a last line of
defence. Record contents (prompts, completions) are never logged at info level:
callers log ids, counts and reasons, and ``event`` makes that the easy path.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from typing import Any

from stream_export.config import Settings

LEVELS = {"debug": "DEBUG", "info": "INFO", "warn": "WARNING", "error": "ERROR"}
REDACTED = "***"
#: Attributes every LogRecord has; anything else was passed through ``extra``.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def event(logger: logging.Logger, name: str, /, level: int = logging.INFO, **fields: Any) -> None:
    """Log one event: a short dotted name plus fields (ids, counts, reasons; no contents)."""
    logger.log(level, name, extra=fields)


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
    """Values that must never appear in a log line."""
    password = settings.sasl_password()
    return [password.reveal()] if password is not None else []


def logging_config(settings: Settings) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` dict: one handler on stderr, our formatter."""
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
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "structured",
            }
        },
        "root": {"level": level, "handlers": ["stderr"]},
    }
