"""Faust application factory: broker, store, topics and tables for one worker.

All topics carry raw bytes; stream-export decodes with msgspec itself (faster than
faust's codecs, and bad input becomes a typed error instead of a crashed agent).
"""

from __future__ import annotations

import asyncio
import ssl
from dataclasses import dataclass
from typing import Any

import faust
from aiokafka import errors as kafka_errors
from aiokafka.conn import collect_hosts, create_conn

from stream_export.config import Settings
from stream_export.errors import AuthenticationError, ConfigError, KafkaUnavailableError

RAW: faust.Schema[bytes, bytes] = faust.Schema(
    key_type=bytes, value_type=bytes, key_serializer="raw", value_serializer="raw"
)


@dataclass(frozen=True)
class Topics:
    steps: Any
    episodes: Any
    dead_letters: Any


def broker_url(settings: Settings) -> str:
    return ";".join(f"kafka://{h.strip()}" for h in settings.kafka.bootstrap_servers.split(","))


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context for SSL / SASL_SSL (system CAs unless ``ssl_cafile``), else None."""
    k = settings.kafka
    if not k.security_protocol.endswith("SSL"):
        return None
    try:
        context = ssl.create_default_context(cafile=k.ssl_cafile)
        if k.ssl_certfile:
            context.load_cert_chain(k.ssl_certfile, k.ssl_keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load TLS files: {exc}") from None
    return context


def _sasl(settings: Settings) -> tuple[str, str, str] | None:
    """(mechanism, username, password) when the protocol is SASL_*, checked for completeness."""
    k = settings.kafka
    if not k.security_protocol.startswith("SASL_"):
        return None
    password = settings.sasl_password()
    if k.sasl_mechanism is None or k.sasl_username is None or password is None:
        raise ConfigError(
            f"{k.security_protocol} needs kafka.sasl_mechanism, kafka.sasl_username and "
            "kafka.sasl_password or kafka.sasl_password_file"
        )
    return k.sasl_mechanism, k.sasl_username, password.reveal()


def kafka_client_kwargs(settings: Settings) -> dict[str, Any]:
    """Security keyword arguments for any aiokafka client (producer, consumer, admin).

    Use as ``AIOKafkaProducer(bootstrap_servers=..., **kafka_client_kwargs(settings))``.
    The result holds the password: pass it on, never log it.
    """
    kwargs: dict[str, Any] = {
        "security_protocol": settings.kafka.security_protocol,
        "ssl_context": ssl_context(settings),
    }
    sasl = _sasl(settings)
    if sasl is not None:
        mechanism, username, password = sasl
        kwargs |= {
            "sasl_mechanism": mechanism,
            "sasl_plain_username": username,
            "sasl_plain_password": password,
        }
    return kwargs


def broker_credentials(settings: Settings) -> faust.types.auth.CredentialsT | None:
    """The same security settings as Faust ``broker_credentials`` (None for PLAINTEXT)."""
    context = ssl_context(settings)
    sasl = _sasl(settings)
    if sasl is not None:
        mechanism, username, password = sasl
        return faust.SASLCredentials(
            username=username, password=password, ssl_context=context, mechanism=mechanism
        )
    return faust.SSLCredentials(context) if context is not None else None


async def check_kafka(settings: Settings, within_s: float = 15.0) -> None:
    """Open one connection with the configured security, so bad credentials fail fast.

    aiokafka's clients log a rejected login and retry as if the broker were down;
    this check tells the two apart. Raises AuthenticationError when a broker
    rejects the credentials, KafkaUnavailableError when none answers in ``within_s``.
    """
    k = settings.kafka
    kwargs = kafka_client_kwargs(settings)
    failures: list[str] = []
    for host, port, _family in collect_hosts(k.bootstrap_servers, randomize=False):
        try:
            conn = await asyncio.wait_for(
                create_conn(
                    host,
                    port,
                    client_id=k.client_id,
                    request_timeout_ms=int(within_s * 1000),
                    **kwargs,
                ),
                within_s,
            )
        except (
            kafka_errors.SaslAuthenticationFailed,
            kafka_errors.AuthenticationFailedError,
            kafka_errors.UnsupportedSaslMechanismError,
            kafka_errors.IllegalSaslStateError,
            ssl.SSLError,
        ) as exc:
            raise AuthenticationError(
                f"Kafka at {host}:{port} rejected the {k.security_protocol} "
                f"{k.sasl_mechanism or 'TLS'} login of user {k.sasl_username!r}: "
                f"{type(exc).__name__}; check the kafka.sasl_* / kafka.ssl_* settings"
            ) from None
        except (TimeoutError, kafka_errors.KafkaError, OSError) as exc:
            failures.append(f"{host}:{port} ({type(exc).__name__})")
            continue
        conn.close()
        return
    raise KafkaUnavailableError(
        f"cannot reach Kafka over {k.security_protocol} within {within_s:g}s: {', '.join(failures)}"
    )


def create_app(settings: Settings, **overrides: Any) -> faust.App:
    """A Faust app configured from settings (at-least-once; see README on guarantees)."""
    app = faust.App(
        settings.worker.app_id,
        broker=broker_url(settings),
        store=settings.worker.store,
        datadir=settings.worker.data_dir,
        topic_partitions=settings.topics.partitions,
        topic_replication_factor=settings.topics.replication_factor,
        processing_guarantee="at_least_once",
        web_enabled=False,
        autodiscover=False,
        key_serializer="raw",
        value_serializer="raw",
        consumer_auto_offset_reset="earliest",
        producer_acks=-1,
        broker_client_id=settings.kafka.client_id,
        broker_credentials=broker_credentials(settings),
        **overrides,
    )
    return app


def declare_topics(app: faust.App, settings: Settings) -> Topics:
    t, n = settings.topics, settings.topics.partitions
    return Topics(
        steps=app.topic(t.steps, schema=RAW, partitions=n),
        episodes=app.topic(t.episodes, schema=RAW, partitions=n),
        dead_letters=app.topic(t.dead_letters, schema=RAW, partitions=n),
    )
