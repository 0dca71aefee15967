"""The ``kafka.*`` settings section (``Settings.kafka``): the brokers, and how every
client of the project connects to them (TLS, SASL)."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from stream_export.errors import ConfigError
from stream_export.settings.values import Bootstrap, NonEmpty, Secret


class KafkaSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: Comma-separated host:port list (a port from 1 to 65535; 9092 if left out).
    bootstrap_servers: Bootstrap = "127.0.0.1:9092"
    #: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    #: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (with a SASL_* protocol).
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: NonEmpty | None = None
    #: The SASL password; prefer sasl_password_file in production. Decoded as a
    #: Secret: it never shows in a repr, a dump, a log line or an error message.
    sasl_password: Secret | None = None
    #: A file whose first line is the SASL password (e.g. a mounted Secret).
    sasl_password_file: NonEmpty | None = None
    #: CA bundle to verify the broker's certificate (SSL / SASL_SSL).
    ssl_cafile: NonEmpty | None = None
    #: Client certificate and its key for mutual TLS; the key file must not be
    #: encrypted (there is no key-password setting, so no second secret).
    ssl_certfile: NonEmpty | None = None
    ssl_keyfile: NonEmpty | None = None
    #: 1-255 characters.
    client_id: Annotated[str, Meta(min_length=1, max_length=255)] = "stream-export"

    def __post_init__(self) -> None:
        for host in self.bootstrap_servers.split(","):
            _, colon, port = host.strip().rpartition(":")
            if colon and port.isdigit() and not 1 <= int(port) <= 65535:
                raise ConfigError(
                    f"invalid setting kafka.bootstrap_servers={self.bootstrap_servers}: "
                    f"port {port} must be from 1 to 65535"
                )
