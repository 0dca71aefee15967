"""The ``worker.*`` settings section (``Settings.worker``): the worker's identity,
its table store, its consumer-group session, its stop and its logs."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from stream_export.settings.values import NonEmpty


class WorkerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: Faust application id: consumer group and table changelog prefix (a topic-name
    #: prefix: 1-200 of [A-Za-z0-9._-], not starting with '.').
    app_id: Annotated[
        str,
        Meta(
            pattern=r"^[A-Za-z0-9_-][A-Za-z0-9._-]{0,199}$",
            description="1-200 letters, digits, '.', '_' or '-', not starting with '.'",
        ),
    ] = "stream-export"
    #: Names this worker's output files and checkpoints; must be unique among
    #: running workers and stable across restarts (default: the host name, which
    #: is the pod name in the Helm StatefulSet). A file-name part: 1-128 of
    #: [A-Za-z0-9._-], starting with a letter or digit.
    worker_id: Annotated[
        str,
        Meta(
            pattern=r"^([A-Za-z0-9][A-Za-z0-9._-]{0,127})?$",
            description="empty (the host name) or 1-128 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit",
        ),
    ] = ""
    #: "rocksdb://" (durable, default) or "memory://" (tests).
    store: Literal["rocksdb://", "memory://"] = "rocksdb://"
    #: Where the table store keeps its files.
    data_dir: NonEmpty = ".stream-export"
    #: The assembler's consumer-group session, 6 to 1800 s. That is the range a
    #: Kafka broker accepts by default (group.min/max.session.timeout.ms). A worker
    #: restarted with the same worker_id gets its partitions back at once (static
    #: membership). A worker that dies hands them to the others only after this long.
    session_timeout_s: Annotated[float, Meta(ge=6, le=1800)] = 30.0
    #: A stop (SIGTERM, or an error) still running after this many seconds prints
    #: every thread's stack to stderr and ends the process with exit code 1, as a
    #: kill -9 would but readable: 5 to 3600 s. Keep it below the time the
    #: supervisor gives a stop (the Helm chart's terminationGracePeriodSeconds, 60).
    stop_deadline_s: Annotated[float, Meta(ge=5, le=3600)] = 30.0
    log_level: Literal["debug", "info", "warn", "error"] = "info"
    log_json: bool = False
