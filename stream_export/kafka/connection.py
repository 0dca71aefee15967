"""Connecting to Kafka with the configured security (TLS, SASL), without Faust.

Agents that use only the producer client import this, not the Faust app.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import weakref
from typing import Any

import aiokafka.client
from aiokafka import errors as kafka_errors
from aiokafka.conn import collect_hosts, create_conn

from stream_export.errors import AuthenticationError, ConfigError, KafkaUnavailableError
from stream_export.settings import Settings

#: Pause between retries of the worker's own Kafka clients (and Faust's, see
#: :mod:`.app`). aiokafka's default, 100 ms, makes every client retry its
#: metadata, coordinator and fetch requests ten times a second while the broker
#: is away; the cost of a longer pause is at most this much more delay after the
#: broker returns.
RETRY_BACKOFF_MS = 1000
#: Least pause between a failed metadata refresh of a worker's or the gateway's client
#: and its next one (pace_metadata_refreshes). aiokafka has none: its producer and its
#: fetcher, missing a partition's leader, refresh again at once, and without the
#: broker a refresh fails at once. Shorter than RETRY_BACKOFF_MS because the
#: consumer's coordinator lookup waits for the refresh it asks for and then its
#: own backoff: a longer pause would slow it, and the worker's stop, that much.
METADATA_RETRY_BACKOFF_MS = 100
#: Longest wait of a fetch for data (Faust fixes 1.5 s). A fetch covers every
#: partition the worker reads from the broker; one waiting for data on idle
#: partitions holds back records arriving for busy ones, so this bounds the
#: delay it adds, at the cost of a few empty fetches a second when all is idle.
FETCH_MAX_WAIT_MS = 100
#: An offset commit of the assembler's consumer waits at most this long (the
#: sink's, when it stops): aiokafka retries a commit until the broker answers,
#: so without the broker a stopping worker would wait for ever. A commit that
#: gives up is retried at the next commit interval; what is never committed is
#: read again on restart (the sink resumes from its checkpoint, the assembler
#: recognises replays).
COMMIT_TIMEOUT_S = 3.0
#: When the worker stops, messages not yet delivered (Faust's producer flush,
#: then its stop) wait at most this long each. Giving up loses nothing: the
#: events behind them are not acknowledged, so a restart handles them again.
STOP_FLUSH_TIMEOUT_S = 2.0


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


def sasl(settings: Settings) -> tuple[str, str, str] | None:
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
    login = sasl(settings)
    if login is not None:
        mechanism, username, password = login
        kwargs |= {
            "sasl_mechanism": mechanism,
            "sasl_plain_username": username,
            "sasl_plain_password": password,
        }
    return kwargs


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


def kafka_options(settings: Settings) -> dict[str, Any]:
    """Every aiokafka client option from the settings: address, client id, security.

    Holds the password: pass it on, never log it.
    """
    return {
        "bootstrap_servers": settings.kafka.bootstrap_servers,
        "client_id": settings.kafka.client_id,
        **kafka_client_kwargs(settings),
    }


def worker_options(settings: Settings) -> dict[str, Any]:
    """:func:`kafka_options` for the worker's long-lived clients: retries back off
    by :data:`RETRY_BACKOFF_MS`. Holds the password: pass it on, never log it."""
    return {**kafka_options(settings), "retry_backoff_ms": RETRY_BACKOFF_MS}


# -- metadata refreshes (an aiokafka private name: compat.NAMES) ---------------------

_unpaced_metadata_update = aiokafka.client.AIOKafkaClient._metadata_update
#: When each aiokafka client's last metadata refresh failed (time.monotonic()).
_REFRESH_FAILED_AT: weakref.WeakKeyDictionary[Any, float] = weakref.WeakKeyDictionary()


def pace_metadata_refreshes() -> None:
    """Make every aiokafka client in this process wait METADATA_RETRY_BACKOFF_MS
    before it retries a metadata refresh that failed.

    aiokafka refreshes whenever asked. Its producer's sender, holding a batch for a
    partition whose leader it has as unknown (a metadata answer during the broker's
    controlled shutdown), and its fetcher, for such a fetched partition, ask again
    as soon as a refresh fails; a broker that refuses connections fails one within
    a millisecond, so such a loop took a whole core for the rest of an outage (the
    gateway logged ~85k failed connections in 10 s and answered nothing).
    """
    aiokafka.client.AIOKafkaClient._metadata_update = _paced_metadata_update


async def _paced_metadata_update(self: Any, cluster_metadata: Any, topics: Any) -> bool:
    """aiokafka's ``AIOKafkaClient._metadata_update`` (same signature: compat.NAMES)."""
    failed_at = _REFRESH_FAILED_AT.get(self)
    if failed_at is not None:
        await asyncio.sleep(failed_at + METADATA_RETRY_BACKOFF_MS / 1000 - time.monotonic())
    updated = bool(await _unpaced_metadata_update(self, cluster_metadata, topics))
    if updated:
        _REFRESH_FAILED_AT.pop(self, None)
    else:
        _REFRESH_FAILED_AT[self] = time.monotonic()
    return updated
