"""The one settings object, loaded from defaults < TOML file < environment < flags.

Every field is typed and documented here, and its bounds are part of its type
(``msgspec.Meta`` constraints, ``Literal`` choices, patterns), so ``load`` refuses
a bad value before anything starts: the first mistake becomes a one-line
ConfigError naming the setting, the value and what is allowed, for example
``invalid setting sink.rotate_bytes=-1: must be an integer from 0 to 1099511627776
(from --set)``. The environment variable for a field is
``STREAM_EXPORT_<SECTION>_<FIELD>`` in upper case (for example
``STREAM_EXPORT_SINK_OUTPUT_DIR``); ``env_names()`` lists them all so the Helm chart
and docker-compose can be checked against the code, and any other
``STREAM_EXPORT_*`` variable (except ``STREAM_EXPORT_CONFIG``) is an error, never
ignored. Flags use ``--set section.field=value``. Secrets are decoded into
:class:`~stream_export.settings.values.Secret`, which shows ``***`` everywhere; only
``reveal()`` gives the text. The value types, their descriptions and the reading
of each source are in :mod:`stream_export.settings.values`.
"""

from __future__ import annotations

import functools
import os
import socket
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta

from stream_export.errors import ConfigError
from stream_export.settings.gateway import GatewaySettings
from stream_export.settings.groups import GroupSettings
from stream_export.settings.scores import ScoreSettings
from stream_export.settings.values import (
    Bootstrap,
    Finite,
    NonEmpty,
    SafeName,
    Secret,
    TopicName,
    convert,
    did_you_mean,
    env_name,
    read_sources,
)

_DAY: Final = 86_400.0
_YEAR: Final = 365 * _DAY
_GIB: Final = 1 << 30
_INT32_MAX: Final = 2**31 - 1


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


class TopicSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: Topic names follow Kafka's rule: 1-249 of [A-Za-z0-9._-], not starting with '.'.
    steps: TopicName = "agent-steps"
    episodes: TopicName = "agent-episodes"
    dead_letters: TopicName = "agent-steps-dlq"
    #: Partitions for topics the worker creates (steps, episodes and tables): 1 to 10000.
    partitions: Annotated[int, Meta(ge=1, le=10_000)] = 4
    #: 1 to 32767 (Kafka's limit); no more than the brokers in the cluster.
    replication_factor: Annotated[int, Meta(ge=1, le=32_767)] = 1


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
    #: The assembler's consumer-group session, 6 to 1800 s (the range a Kafka broker
    #: accepts by default: group.min/max.session.timeout.ms). A worker restarted
    #: with the same worker_id gets its partitions back at once (static
    #: membership); a worker that dies hands them to the others only after this long.
    session_timeout_s: Annotated[float, Meta(ge=6, le=1800)] = 30.0
    #: A stop (SIGTERM, or an error) still running after this many seconds prints
    #: every thread's stack to stderr and ends the process with exit code 1, as a
    #: kill -9 would but readable: 5 to 3600 s. Keep it below the time the
    #: supervisor gives a stop (the Helm chart's terminationGracePeriodSeconds, 60).
    stop_deadline_s: Annotated[float, Meta(ge=5, le=3600)] = 30.0
    log_level: Literal["debug", "info", "warn", "error"] = "info"
    log_json: bool = False


#: What a published record may add to an episode's events (its own fields, the
#: source offsets of its steps), and again what a Kafka record adds to that.
RECORD_ENVELOPE: Final = 32 * 1024


class AssembleSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: An episode with no event for this long (event time) times out: > 0, at most 30 days.
    idle_timeout_s: Annotated[float, Meta(gt=0, le=30 * _DAY)] = 300.0
    #: Extra event time allowed for stragglers after the idle timeout: 0 to 30 days.
    grace_s: Annotated[float, Meta(ge=0, le=30 * _DAY)] = 30.0
    #: A partition with no new events closes its due episodes on the wall clock
    #: after this many seconds of silence: > 0, at most 1 day.
    quiet_partition_s: Annotated[float, Meta(gt=0, le=_DAY)] = 60.0
    #: What to do with a timed-out episode: emit it marked truncated, or drop it.
    timeout_policy: Literal["emit", "drop"] = "emit"
    #: An episode with more steps (a step seq at or beyond this, or an end event
    #: announcing more) is emitted truncated ("max_steps"): 1 to 2**31 - 1.
    max_steps: Annotated[int, Meta(ge=1, le=_INT32_MAX)] = 10_000
    #: An episode whose events add up to more bytes is emitted truncated
    #: ("max_bytes"): 1 byte to 1 GiB, and at least max_event_bytes.
    max_episode_bytes: Annotated[int, Meta(ge=1, le=_GIB)] = 16 * 1024 * 1024
    #: Largest accepted step-event message; larger ones go to the dead-letter
    #: topic: 1 byte to 1 GiB.
    max_event_bytes: Annotated[int, Meta(ge=1, le=_GIB)] = 1_048_576
    #: How long closed-episode ids are remembered to detect late events: > 0, at
    #: most 10 years, and at least window_expires_s.
    closed_retention_s: Annotated[float, Meta(gt=0, le=10 * _YEAR)] = 7 * 24 * 3600.0
    #: The open-episodes table is a Faust tumbling-window table: an episode's state
    #: is filed under the window (of this size, on the wall clock) of its first
    #: write, and Faust deletes a window's state window_expires_s after it ends.
    #: That expiry is only a backstop for abandoned state, long after any episode
    #: has closed; closing is our own logic. Both > 0 and at most 10 years;
    #: window_s <= window_expires_s.
    window_s: Annotated[float, Meta(gt=0, le=10 * _YEAR)] = 3600.0
    window_expires_s: Annotated[float, Meta(gt=0, le=10 * _YEAR)] = 3 * 24 * 3600.0
    #: An episode whose events span more event time than this is closed truncated
    #: (keeps every open episode well inside window_expires_s): > idle_timeout_s,
    #: at most 10 years.
    max_duration_s: Annotated[float, Meta(gt=0, le=10 * _YEAR)] = 24 * 3600.0
    #: Events stamped further ahead of the worker's clock are dead-lettered, so one
    #: bad agent clock cannot time out a whole partition: > 0, at most 30 days.
    max_future_s: Annotated[float, Meta(gt=0, le=30 * _DAY)] = 3600.0
    #: Events handled together: one chunk write per episode per batch (1 to 1,000,000).
    batch_max_events: Annotated[int, Meta(ge=1, le=1_000_000)] = 2000
    #: Longest wait to fill a batch (adds at most this latency): > 0, at most 60 s.
    batch_max_wait_s: Annotated[float, Meta(gt=0, le=60)] = 0.1
    #: New events of still-open episodes are written to the open-episodes table
    #: (one chunk per episode) at most this long after they arrive; only then are
    #: their offsets committed. Episodes that finish sooner are never written.
    #: > 0, at most 3600 s.
    persist_interval_s: Annotated[float, Meta(gt=0, le=3600)] = 1.0

    @property
    def max_record_bytes(self) -> int:
        """The largest value the worker publishes (an episode, a group record, a dead
        letter's value): an episode's events plus room for what the record adds."""
        return self.max_episode_bytes + RECORD_ENVELOPE

    @property
    def max_message_bytes(self) -> int:
        """The ``max.message.bytes`` every topic the worker writes needs (and the
        producer's request size): a record of :attr:`max_record_bytes`, its key,
        headers and framing."""
        return self.max_episode_bytes + 2 * RECORD_ENVELOPE

    def __post_init__(self) -> None:
        if self.max_episode_bytes < self.max_event_bytes:
            raise ConfigError(
                f"invalid setting assemble.max_episode_bytes={self.max_episode_bytes}: must be >= "
                f"assemble.max_event_bytes ({self.max_event_bytes})"
            )
        if self.max_duration_s <= self.idle_timeout_s:
            raise ConfigError(
                f"invalid setting assemble.max_duration_s={self.max_duration_s:g}: must be > "
                f"assemble.idle_timeout_s ({self.idle_timeout_s:g})"
            )
        lifetime = self.max_duration_s + self.idle_timeout_s + self.grace_s
        floor = 2 * (lifetime + self.quiet_partition_s)
        if self.window_expires_s < floor:
            raise ConfigError(
                f"invalid setting assemble.window_expires_s={self.window_expires_s:g}: "
                f"must be >= {floor:g}, twice max_duration_s + idle_timeout_s + grace_s + "
                "quiet_partition_s (it is only a backstop)"
            )
        if self.window_s > self.window_expires_s:
            raise ConfigError(
                f"invalid setting assemble.window_s={self.window_s:g}: must be <= "
                f"assemble.window_expires_s ({self.window_expires_s:g})"
            )
        if self.closed_retention_s < self.window_expires_s:
            raise ConfigError(
                f"invalid setting assemble.closed_retention_s={self.closed_retention_s:g}: "
                f"must be >= assemble.window_expires_s ({self.window_expires_s:g})"
            )


class FormatSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: text (prompt/completion strings), conversational (TRL messages), messages
    #: (the whole conversation in one "messages" list, for SFT trainers), episode
    #: (the whole structured episode), tokens (one row per token segment of the
    #: episode's model calls: input_ids, loss_mask, logprobs, prompt_len, for
    #: token-level RL trainers), or a formatter registered under the
    #: stream_export.formatters entry point, or a dotted path "package.module:function".
    format: NonEmpty = "text"
    #: One record per episode, or one per decision step (not for messages).
    granularity: Literal["episode", "step"] = "episode"
    #: What the text of a completion starts with, so that a trainer joining prompt +
    #: completion as they are (TRL, OpenRLHF) finds a break between them: a blank
    #: line, a newline, a space, or none (the Daydreams bytes). Group outputs too.
    text_separator: Literal["blank_line", "newline", "space", "none"] = "blank_line"
    #: Metadata as top-level columns, nested under "metadata", or left out (the
    #: default: text records are then exactly the seed's {"prompt", "completion"}).
    #: The episode format always carries every field and ignores this.
    metadata_mode: Literal["columns", "nested", "none"] = "none"
    #: Which metadata fields to include; empty means the documented default set
    #: (formats.DEFAULT_METADATA_FIELDS). Names: episode_id, agent_id, group_id,
    #: outcome, reward, steps, duration, truncated, truncated_reason, domain,
    #: difficulty, start_time, end_time, decision (step granularity), rewards,
    #: scores, scores_missing (the reward's components), or any key of the
    #: episode metadata.
    metadata_fields: list[NonEmpty] = []
    #: Write only episodes whose outcome is "success".
    only_success: bool = False
    #: Write only episodes with at least / at most this many steps (0 to 2**31 - 1;
    #: min_steps <= max_steps).
    min_steps: Annotated[int, Meta(ge=0, le=_INT32_MAX)] | None = None
    max_steps: Annotated[int, Meta(ge=0, le=_INT32_MAX)] | None = None
    #: Write only episodes with a reward of at least this (a finite number; no
    #: reward: dropped).
    min_reward: Finite | None = None
    #: Keep only these domains (metadata "domain"); empty keeps all.
    domains: list[NonEmpty] = []

    def __post_init__(self) -> None:
        low, high = self.min_steps, self.max_steps
        if low is not None and high is not None and low > high:
            raise ConfigError(
                f"invalid setting format.min_steps={low}: must be <= format.max_steps ({high})"
            )


class SinkSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: Where the output files go.
    output_dir: NonEmpty = "."
    #: File-name prefix: 1-128 of [A-Za-z0-9._-], starting with a letter or digit.
    prefix: SafeName = "training-data"
    #: Seal the active file at this size: 0 (no size limit) to 1 TiB.
    rotate_bytes: Annotated[int, Meta(ge=0, le=1 << 40)] = 256 * 1024 * 1024
    #: Seal the active file at this many records: 0 (no limit) to 2**31 - 1.
    rotate_records: Annotated[int, Meta(ge=0, le=_INT32_MAX)] = 0
    #: Seal the active file when it is this old, idle files too: 0 (disabled) to 10 years.
    rotate_age_s: Annotated[float, Meta(ge=0, le=10 * _YEAR)] = 3600.0
    #: How often buffered lines reach the file (tailers see them then): 1 to 60000 ms.
    flush_interval_ms: Annotated[int, Meta(ge=1, le=60_000)] = 200
    #: When to fsync: every flush, at rotation only, or never.
    fsync: Literal["flush", "rotation", "never"] = "rotation"
    #: Sealed JSON-lines files compressed as a whole.
    compression: Literal["none", "gzip", "zstd"] = "none"
    #: How sealed files are written: JSON lines, or Parquet (one file per rotation,
    #: the output's typed schema; the active file stays JSON lines).
    encoding: Literal["jsonl", "parquet"] = "jsonl"
    #: The codec inside Parquet files.
    parquet_compression: Literal["zstd", "snappy", "gzip", "none"] = "zstd"
    #: Ship each sealed file and its manifest entry to S3-compatible storage:
    #: s3://bucket[/prefix] (credentials from the AWS environment). Empty: off.
    upload_url: Annotated[str, Meta(pattern=r"^s3://[^/]+(/.*)?$")] | None = None
    #: The S3 endpoint for another S3-compatible server (e.g. http://host:8333).
    upload_endpoint: Annotated[str, Meta(pattern=r"^https?://")] | None = None
    #: Keep a sealed file on disk once uploaded (retention still applies).
    keep_uploaded: bool = True
    #: Optional metadata field whose value names a sub-folder, Hive-style
    #: ``<field>=<value>/`` (an unsafe value: ``<field>=_rejected/``): a safe name.
    partition_by: SafeName | None = None
    #: With partition_by: active files kept open at once, 1 to 100,000; the least
    #: recently written one is closed first (and opened again when written to).
    max_open_files: Annotated[int, Meta(ge=1, le=100_000)] = 64
    #: With partition_by: partition folders with an active file at once (each is an
    #: entry of the checkpoint), 1 to 100,000; beyond it the least recently written
    #: one is sealed (reason "evicted").
    max_active_files: Annotated[int, Meta(ge=1, le=100_000)] = 256
    #: Keep at most this many sealed files / bytes (0: no limit); only manifested
    #: sealed files are ever deleted, oldest first. Files: 0 to 10,000,000;
    #: bytes: 0 to 2**62.
    retention_files: Annotated[int, Meta(ge=0, le=10_000_000)] = 0
    retention_bytes: Annotated[int, Meta(ge=0, le=1 << 62)] = 0
    #: How many recent episode ids the sink remembers to drop re-emitted episodes:
    #: 0 (no deduplication) to 10,000,000.
    dedupe_window: Annotated[int, Meta(ge=0, le=10_000_000)] = 100_000
    #: Longest pause between retries while the output is not writable: > 0, at most 3600 s.
    retry_max_s: Annotated[float, Meta(gt=0, le=3600)] = 5.0
    #: When a topic is not the one whose offsets were kept (deleted and created
    #: again, or the broker's data wiped): "stop" with an error saying what to do,
    #: or "new_epoch": the sink seals its files and writes the new episodes topic
    #: from its beginning as a new epoch (in the manifest and checkpoint), and the
    #: assembler discards its stale local table state (its open episodes are lost).
    on_topic_reset: Literal["stop", "new_epoch"] = "stop"

    def __post_init__(self) -> None:
        if self.encoding == "parquet" and self.compression != "none":
            raise ConfigError(
                f"invalid setting sink.compression={self.compression}: Parquet files "
                "compress inside (sink.parquet_compression); leave it none"
            )


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


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    kafka: KafkaSettings = msgspec.field(default_factory=KafkaSettings)
    topics: TopicSettings = msgspec.field(default_factory=TopicSettings)
    worker: WorkerSettings = msgspec.field(default_factory=WorkerSettings)
    assemble: AssembleSettings = msgspec.field(default_factory=AssembleSettings)
    format: FormatSettings = msgspec.field(default_factory=FormatSettings)
    sink: SinkSettings = msgspec.field(default_factory=SinkSettings)
    groups: GroupSettings = msgspec.field(default_factory=GroupSettings)
    scores: ScoreSettings = msgspec.field(default_factory=ScoreSettings)
    http: HttpSettings = msgspec.field(default_factory=HttpSettings)
    gateway: GatewaySettings = msgspec.field(default_factory=GatewaySettings)

    def __post_init__(self) -> None:
        a, hold = self.assemble, self.scores.hold_s
        floor = 2 * (a.max_duration_s + a.idle_timeout_s + a.grace_s + hold + a.quiet_partition_s)
        if hold and a.window_expires_s < floor:
            raise ConfigError(
                f"invalid setting scores.hold_s={hold:g}: assemble.window_expires_s "
                f"({a.window_expires_s:g}) must be >= {floor:g}, twice an episode's longest "
                "life with its hold"
            )
        g = self.groups
        if g.judge_url is not None and not self.scores.enabled:
            raise ConfigError(
                f"invalid setting groups.judge_url={g.judge_url!r}: needs scores.enabled=true "
                "(the judge's scores are late scores: without the scores output they would "
                "be dead letters late_score)"
            )
        if g.judge_url is not None and g.judge_name in self.scores.required:
            raise ConfigError(
                f"invalid setting scores.required: {g.judge_name!r} is groups.judge_name "
                "(the judge scores a group after its rollouts are published: none can wait for it)"
            )
        if not self.worker.worker_id:
            host = socket.gethostname()
            try:
                msgspec.convert(host, _field_types()["worker"]["worker_id"])
            except msgspec.ValidationError:
                raise ConfigError(
                    f"invalid setting worker.worker_id: the host name {host!r} is not a safe "
                    "file-name part; set worker.worker_id"
                ) from None
            self.worker.worker_id = host

    def group_timeout_s(self) -> float:
        """groups.timeout_s, or the episode timeout plus grace when that is longer, or
        scores.hold_s with required scores (a rollout waits that long for them)."""
        a, hold = self.assemble, self.scores.hold_s if self.scores.required else 0.0
        return max(self.groups.timeout_s, a.idle_timeout_s + a.grace_s, hold)

    def sasl_password(self) -> Secret | None:
        """The SASL password from the setting or its file, as a Secret."""
        k = self.kafka
        if k.sasl_password_file:
            try:
                return Secret(Path(k.sasl_password_file).read_text().splitlines()[0])
            except (OSError, IndexError) as exc:
                raise ConfigError(f"cannot read sasl_password_file: {exc}") from None
        return k.sasl_password

    def redacted(self) -> dict[str, Any]:
        """The settings as builtins, every Secret as ``***``: safe to log or show."""
        data: dict[str, Any] = msgspec.to_builtins(self, enc_hook=_hide)
        return data


def _hide(obj: Any) -> Any:
    if isinstance(obj, Secret):
        return str(obj)
    raise TypeError(f"cannot encode {type(obj).__name__}")


def _sections() -> dict[str, type[msgspec.Struct]]:
    return {f.name: f.type for f in msgspec.structs.fields(Settings)}


@functools.cache
def _field_types() -> dict[str, dict[str, Any]]:
    """section -> field -> its (annotated) type."""
    return {
        section: {f.name: f.type for f in msgspec.structs.fields(cls)}
        for section, cls in _sections().items()
    }


def env_names() -> list[str]:
    """Every environment variable the settings read, in a stable order."""
    return [env_name(s, f) for s, fields in _field_types().items() for f in fields]


def field_types() -> dict[str, Any]:
    """``section.field`` -> its annotated type, for every setting (docs and the Helm schema)."""
    return {f"{s}.{f}": t for s, fields in _field_types().items() for f, t in fields.items()}


def sources(
    *,
    file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Iterable[str] = (),
) -> dict[str, str]:
    """``section.field`` -> where its value came from (a file, a variable, --set), for
    every setting not left at its default; the same arguments as ``load``."""
    raw = read_sources(field_types(), file, os.environ if env is None else env, overrides)
    return {key: source for key, (_, source) in raw.items()}


def load(
    *,
    file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Iterable[str] = (),
) -> Settings:
    """Build Settings from a TOML file, the environment and ``section.field=value`` flags.

    Raises ConfigError, one line naming the setting and what it allows, at the
    first unknown name (in the file, the environment or a flag) or bad value.
    """
    types_ = field_types()
    values: dict[str, dict[str, Any]] = {section: {} for section in _sections()}
    raw = read_sources(types_, file, os.environ if env is None else env, overrides)
    for key, (value, source) in raw.items():
        if key not in types_:
            raise ConfigError(f"unknown setting {key} (from {source}){did_you_mean(key, types_)}")
        section, _, field = key.partition(".")
        values[section][field] = convert(key, types_[key], value, source)
    sections: dict[str, Any] = {s: cls(**values[s]) for s, cls in _sections().items()}
    return Settings(**sections)
