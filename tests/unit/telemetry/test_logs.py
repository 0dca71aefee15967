"""Structured logs: one line per event, JSON on request, secrets never shown."""

from __future__ import annotations

import io
import json
import logging
import logging.config
from collections.abc import Iterator

import msgspec
import pytest
from faust.tables.recovery import RebalanceAgain, ServiceStopped

from stream_export.settings import Settings, load
from stream_export.settings.values import Secret, unwrap
from stream_export.telemetry import logs


@pytest.fixture
def capture() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    logger = logging.getLogger("test.logs")
    handler = logging.StreamHandler(stream)
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)


def use(logger: logging.Logger, formatter: logging.Formatter) -> None:
    for handler in logger.handlers:
        handler.setFormatter(formatter)


def test_json_lines_carry_the_event_and_its_fields(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = capture
    use(logger, logs.JsonFormatter())
    logs.event(logger, "episode.emitted", episode_id="e-1", steps=7)
    line = json.loads(stream.getvalue())
    assert line["msg"] == "episode.emitted" and line["level"] == "info"
    assert (line["episode_id"], line["steps"]) == ("e-1", 7)
    assert line["ts"].endswith("Z") and line["logger"] == "test.logs"


def test_every_event_is_one_line_even_with_a_traceback(
    capture: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = capture
    for formatter in (logs.JsonFormatter(), logs.TextFormatter()):
        use(logger, formatter)
        try:
            raise ValueError("bad\nthing")
        except ValueError:
            logger.exception("first line\nsecond line")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2
    assert "ValueError" in json.loads(lines[0])["exc"]
    assert "first line\\nsecond line" in lines[1] and "exc=" in lines[1]


def test_text_lines_are_key_value(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture
    use(logger, logs.TextFormatter())
    logs.event(logger, "sink.rotated", logging.WARNING, reason="size", path="a b.jsonl")
    line = stream.getvalue().strip()
    assert " WARNING test.logs: sink.rotated reason=size " in line
    assert line.endswith('path="a b.jsonl"')


def test_secrets_never_reach_a_line(capture: tuple[logging.Logger, io.StringIO]) -> None:
    logger, stream = capture
    for formatter in (logs.JsonFormatter(["hunter2"]), logs.TextFormatter(["hunter2"])):
        use(logger, formatter)
        logger.error("login with %s failed", "hunter2", extra={"password": "hunter2"})
    assert "hunter2" not in stream.getvalue()
    assert stream.getvalue().count(logs.REDACTED) == 4


def test_config_picks_the_format_level_and_secrets() -> None:
    s = load(
        env={},
        overrides=["worker.log_json=true", "worker.log_level=warn", "kafka.sasl_password=pw1"],
    )
    cfg = logs.logging_config(s)
    assert cfg["root"]["level"] == "WARNING"
    assert cfg["formatters"]["structured"]["()"] == "stream_export.telemetry.logs.JsonFormatter"
    assert cfg["formatters"]["structured"]["secrets"] == ["pw1"]
    logging.config.dictConfig(cfg)  # a valid dictConfig
    text = logs.logging_config(load(env={}))
    assert text["formatters"]["structured"]["()"] == "stream_export.telemetry.logs.TextFormatter"
    assert text["formatters"]["structured"]["secrets"] == []


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_repeated_warnings_are_one_line_per_cause_per_window_with_a_count() -> None:
    clock = Clock()
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter())
    handler.addFilter(logs.RepeatFilter(window_s=10.0, clock=clock))
    first, other = logging.getLogger("test.repeats"), logging.getLogger("test.repeats.other")
    for logger in (first, other):
        logger.handlers, logger.propagate = [handler], False
        logger.setLevel(logging.DEBUG)
    for second in range(25):  # 25 s of a flood, 10 lines a second per cause
        clock.now = 1000.0 + second
        for _ in range(10):
            first.error("Unable connect to node with id %s: %s", 1, "refused")
            first.warning("Failed fetch messages from %s", 1)
            first.info("state change %d", second)
            other.error("Unable connect to node with id %s: %s", 1, "refused")
    by_cause: dict[tuple[str, str], list[dict[str, object]]] = {}
    for line in map(json.loads, stream.getvalue().splitlines()):
        by_cause.setdefault((line["logger"], line["level"]), []).append(line)
    connect = by_cause[("test.repeats", "error")]
    assert [c.get("suppressed") for c in connect] == [None, 99, 99]
    assert all(c["msg"] == "Unable connect to node with id 1: refused" for c in connect)
    assert len(by_cause[("test.repeats", "warning")]) == 3
    assert len(by_cause[("test.repeats.other", "error")]) == 3  # another logger, its own cause
    assert len(by_cause[("test.repeats", "info")]) == 250  # info lines are never limited


def test_the_worker_config_limits_repeats_on_every_logger() -> None:
    cfg = logs.logging_config(load(env={}))
    assert cfg["handlers"]["stderr"]["filters"] == ["recovery_ended", "repeats"]
    stream = io.StringIO()
    cfg["handlers"]["stderr"]["stream"] = stream
    logging.config.dictConfig(cfg)
    try:
        for name in ("aiokafka", "faust.transport.drivers.aiokafka", "mode.redirect"):
            for _ in range(50):
                logging.getLogger(name).warning("same %s", "text")
    finally:
        logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})
    assert len(stream.getvalue().splitlines()) == 3


def test_a_recovery_step_faust_ended_at_a_stop_is_one_info_line() -> None:
    """asyncio reports the step Faust's recovery left running as an error with a
    traceback; the worker's config makes it one info line, and leaves others be."""
    cfg = logs.logging_config(load(env={}))
    stream = io.StringIO()
    cfg["handlers"]["stderr"]["stream"] = stream
    logging.config.dictConfig(cfg)
    never = "Task exception was never retrieved"
    try:
        for exc in (ServiceStopped(), RebalanceAgain(), ValueError("a real one")):
            logging.getLogger("asyncio").error(never, exc_info=(type(exc), exc, None))
    finally:
        logging.config.dictConfig({"version": 1, "disable_existing_loggers": False})
    lines = stream.getvalue().splitlines()
    assert [line.split(" ", 2)[1:] for line in lines[:2]] == [
        ["INFO", "asyncio: faust: a table recovery step ended: ServiceStopped"],
        ["INFO", "asyncio: faust: a table recovery step ended: RebalanceAgain"],
    ]
    assert " ERROR asyncio: " + never in lines[2] and "ValueError" in lines[2]


def secret_settings() -> list[str]:
    """Every setting typed Secret, read from the settings object's own fields."""
    return [
        f"{section.name}.{field.name}"
        for section in msgspec.structs.fields(Settings)
        for field in msgspec.structs.fields(section.type)
        if unwrap(field.type)[0] is Secret
    ]


def test_every_secret_setting_is_scrubbed(capture: tuple[logging.Logger, io.StringIO]) -> None:
    names = secret_settings()
    assert {"kafka.sasl_password", "gateway.upstream_api_key", "groups.judge_api_key"} <= set(names)
    values = {name: f"s3cr3t-{i}-{name}" for i, name in enumerate(names)}
    settings = load(env={}, overrides=[f"{k}={v}" for k, v in values.items()])
    logger, stream = capture
    cfg = logs.logging_config(settings)["formatters"]["structured"]
    for formatter in (logs.JsonFormatter(cfg["secrets"]), logs.TextFormatter(cfg["secrets"])):
        use(logger, formatter)
        logger.error("calling with %s", " ".join(values.values()), extra=dict(values))
    assert not [v for v in values.values() if v in stream.getvalue()]
    assert stream.getvalue().count(logs.REDACTED) == 4 * len(values)
