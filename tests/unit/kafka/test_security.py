"""Kafka security settings become aiokafka and Faust arguments; secrets stay hidden.
(tests/integration/kafka/test_security.py runs them against a SASL/SCRAM broker.)"""

from __future__ import annotations

import asyncio
import json
import logging
import ssl
import sys
from pathlib import Path

import faust
import msgspec
import pytest

from stream_export.errors import ConfigError, KafkaUnavailableError
from stream_export.kafka import connection
from stream_export.runtime import app
from stream_export.settings import Settings, load, values
from stream_export.telemetry import logs
from tests.support.monitoring import free_port


def settings(*overrides: str) -> Settings:
    return load(env={}, overrides=list(overrides))


SCRAM = (
    "kafka.security_protocol=SASL_PLAINTEXT",
    "kafka.sasl_mechanism=SCRAM-SHA-512",
    "kafka.sasl_username=alice",
    "kafka.sasl_password=pw-1",
)


def test_plaintext_needs_nothing() -> None:
    s = settings()
    assert connection.kafka_client_kwargs(s) == {
        "security_protocol": "PLAINTEXT",
        "ssl_context": None,
    }
    assert app.broker_credentials(s) is None


def test_sasl_scram_for_aiokafka_and_faust() -> None:
    s = settings(*SCRAM)
    kwargs = connection.kafka_client_kwargs(s)
    assert kwargs["sasl_mechanism"] == "SCRAM-SHA-512"
    assert (kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]) == ("alice", "pw-1")
    creds = app.broker_credentials(s)
    assert isinstance(creds, faust.SASLCredentials)
    assert creds.mechanism.value == "SCRAM-SHA-512" and "pw-1" not in repr(creds)


def test_sasl_ssl_verifies_the_broker() -> None:
    s = settings(*SCRAM, "kafka.security_protocol=SASL_SSL", "kafka.sasl_mechanism=PLAIN")
    kwargs = connection.kafka_client_kwargs(s)
    context = kwargs["ssl_context"]
    assert isinstance(context, ssl.SSLContext) and context.verify_mode == ssl.CERT_REQUIRED
    creds = app.broker_credentials(s)
    assert isinstance(creds, faust.SASLCredentials) and creds.ssl_context is not None
    tls = app.broker_credentials(settings("kafka.security_protocol=SSL"))
    assert isinstance(tls, faust.SSLCredentials)


def test_password_from_a_file(tmp_path: Path) -> None:
    (tmp_path / "pw").write_text("from-file\n")
    s = settings(*SCRAM[:3], f"kafka.sasl_password_file={tmp_path / 'pw'}")
    assert connection.kafka_client_kwargs(s)["sasl_plain_password"] == "from-file"


@pytest.mark.parametrize("missing", ["kafka.sasl_mechanism", "kafka.sasl_username"])
def test_incomplete_sasl_settings_are_a_config_error(missing: str) -> None:
    s = settings(*(o for o in SCRAM if not o.startswith(missing)))
    with pytest.raises(ConfigError, match=r"needs kafka\.sasl_mechanism"):
        connection.kafka_client_kwargs(s)


def test_unreadable_tls_files_are_a_config_error() -> None:
    s = settings("kafka.security_protocol=SSL", "kafka.ssl_cafile=/nonexistent/ca.pem")
    with pytest.raises(ConfigError, match="TLS"):
        connection.ssl_context(s)


def test_no_broker_fails_fast_as_unavailable() -> None:
    s = settings(f"kafka.bootstrap_servers=127.0.0.1:{free_port()}")
    with pytest.raises(KafkaUnavailableError, match="cannot reach Kafka"):
        asyncio.run(connection.check_kafka(s, within_s=5))


PASSWORD = "pw-Secret-42"


def with_password() -> Settings:
    return settings(*SCRAM[:3], f"kafka.sasl_password={PASSWORD}")


def test_the_password_is_a_secret_in_every_rendering_of_the_settings() -> None:
    s = with_password()
    assert isinstance(s.kafka.sasl_password, values.Secret)
    shown = [repr(s), str(s), repr(s.kafka), f"{s.kafka.sasl_password}", str(s.redacted())]
    shown.append(json.dumps(s.redacted()))
    assert all(PASSWORD not in text for text in shown)
    for dump in (msgspec.to_builtins, msgspec.json.encode):
        with pytest.raises(TypeError) as info:  # never a clear-text dump by accident
            dump(s)
        assert PASSWORD not in str(info.value)
    assert connection.kafka_client_kwargs(s)["sasl_plain_password"] == PASSWORD  # .reveal()


@pytest.mark.parametrize("formatter", [logs.TextFormatter, logs.JsonFormatter])
def test_log_lines_never_show_it_even_without_the_scrub_list(
    formatter: type[logs.TextFormatter] | type[logs.JsonFormatter],
) -> None:
    """The Secret type hides it by itself; the formatter's scrub list is a second guard."""
    s = with_password()
    try:
        raise ConfigError(f"bad kafka settings {s.kafka!r}")
    except ConfigError:
        exc_info = sys.exc_info()
    record = logging.LogRecord("t", logging.ERROR, __file__, 1, "settings %r", (s,), exc_info)
    record.__dict__.update(settings=s, password=s.kafka.sasl_password)
    line = formatter().format(record)
    assert PASSWORD not in line and "***" in line
    record.msg, record.args = f"clear {PASSWORD}", ()
    assert PASSWORD not in formatter(secrets=logs.secrets(s)).format(record)
