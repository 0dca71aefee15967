"""Kafka security settings become aiokafka and Faust arguments; secrets stay hidden.
(tests/integration/test_security.py runs them against a SASL/SCRAM broker.)"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import faust
import pytest

from stream_export import app, config, connection
from stream_export.errors import ConfigError, KafkaUnavailableError
from tests.monitoring import free_port


def settings(*overrides: str) -> config.Settings:
    return config.load(env={}, overrides=list(overrides))


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
