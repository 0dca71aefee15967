"""The ``http.*`` settings section (``Settings.http``): the worker's endpoints
(metrics, health, readiness, the status page) and the probe port."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta

from stream_export.errors import ConfigError
from stream_export.settings.values import NonEmpty


class HttpSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: /metrics, /healthz, /readyz and the status page are served here (and the
    #: probe port, when set).
    host: NonEmpty = "127.0.0.1"
    #: 1 to 65535.
    port: Annotated[int, Meta(ge=1, le=65_535)] = 9108
    #: A port of the orchestrator's probes: /healthz and /readyz only, paced per
    #: client address, so no other client (a flood on http.port or on this port)
    #: can delay the kubelet's probes. 1 to 65535, not http.port; empty: none
    #: (probe http.port, whose pacing all clients share).
    probe_port: Annotated[int, Meta(ge=1, le=65_535)] | None = None
    enabled: bool = True
    #: Show the beginnings of the newest records on the status page and in
    #: /status.json. They hold episode ids and content (an episode id is also the
    #: path of its calls through the gateway): anyone who reaches http.port reads them.
    record_previews: bool = False

    def __post_init__(self) -> None:
        if self.probe_port == self.port:
            raise ConfigError(
                f"invalid setting http.probe_port={self.probe_port}: must differ from "
                f"http.port ({self.port})"
            )
