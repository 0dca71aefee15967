"""The one settings object, loaded from defaults < TOML file < environment < flags.

Every field is typed and documented here. The environment variable for a field is
``STREAM_EXPORT_<SECTION>_<FIELD>`` in upper case (for example
``STREAM_EXPORT_SINK_OUTPUT_DIR``); ``env_names()`` lists them all so the Helm chart
and docker-compose can be checked against the code. Flags use ``--set
section.field=value``. Secrets are wrapped in :class:`Secret` and never printed.
"""

from __future__ import annotations

import os
import socket
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

import msgspec

from stream_export.errors import ConfigError

ENV_PREFIX = "STREAM_EXPORT_"


class Secret(str):
    """A string that never shows itself in repr, logs or dumps."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "Secret('***')"

    def reveal(self) -> str:
        return str.__str__(self)


class KafkaSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: Comma-separated host:port list.
    bootstrap_servers: str = "127.0.0.1:9092"
    #: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    #: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (with a SASL_* protocol).
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    #: The SASL password; prefer sasl_password_file in production.
    sasl_password: str | None = None
    #: A file whose first line is the SASL password (e.g. a mounted Secret).
    sasl_password_file: str | None = None
    #: CA bundle to verify the broker's certificate (SSL / SASL_SSL).
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    client_id: str = "stream-export"


class TopicSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    steps: str = "agent-steps"
    episodes: str = "agent-episodes"
    dead_letters: str = "agent-steps-dlq"
    #: Partitions for topics the worker creates (steps, episodes and tables).
    partitions: int = 4
    replication_factor: int = 1


class WorkerSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: Faust application id: consumer group and table changelog prefix.
    app_id: str = "stream-export"
    #: Names this worker's output files and checkpoints; must be unique among
    #: running workers and stable across restarts (default: the host name, which
    #: is the pod name in the Helm StatefulSet).
    worker_id: str = ""
    #: "rocksdb://" (durable, default) or "memory://" (tests).
    store: str = "rocksdb://"
    #: Where the table store keeps its files.
    data_dir: str = ".stream-export"
    #: The assembler's consumer-group session. A worker restarted with the same
    #: worker_id gets its partitions back at once (static membership); a worker
    #: that dies hands them to the others only after this long.
    session_timeout_s: float = 30.0
    log_level: Literal["debug", "info", "warn", "error"] = "info"
    log_json: bool = False


class AssembleSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: An episode with no event for this long (event time) times out.
    idle_timeout_s: float = 300.0
    #: Extra event time allowed for stragglers after the idle timeout.
    grace_s: float = 30.0
    #: A partition with no new events closes its due episodes on the wall clock
    #: after this many seconds of silence.
    quiet_partition_s: float = 60.0
    #: What to do with a timed-out episode: emit it marked truncated, or drop it.
    timeout_policy: Literal["emit", "drop"] = "emit"
    #: An episode with more steps (a step seq at or beyond this, or an end event
    #: announcing more) is emitted truncated ("max_steps").
    max_steps: int = 10_000
    #: An episode whose events add up to more bytes is emitted truncated ("max_bytes").
    max_episode_bytes: int = 16 * 1024 * 1024
    #: Largest accepted step-event message; larger ones go to the dead-letter topic.
    max_event_bytes: int = 1_048_576
    #: How long closed-episode ids are remembered to detect late events.
    closed_retention_s: float = 7 * 24 * 3600.0
    #: The open-episodes table is a Faust tumbling-window table: an episode's state
    #: is filed under the window (of this size, on the wall clock) of its first
    #: write, and Faust deletes a window's state window_expires_s after it ends.
    #: That expiry is only a backstop for abandoned state, long after any episode
    #: has closed; closing is our own logic.
    window_s: float = 3600.0
    window_expires_s: float = 3 * 24 * 3600.0
    #: An episode whose events span more event time than this is closed truncated
    #: (keeps every open episode well inside window_expires_s).
    max_duration_s: float = 24 * 3600.0
    #: Events stamped further ahead of the worker's clock are dead-lettered, so one
    #: bad agent clock cannot time out a whole partition.
    max_future_s: float = 3600.0
    #: Events handled together: one chunk write per episode per batch.
    batch_max_events: int = 2000
    #: Longest wait to fill a batch (adds at most this latency).
    batch_max_wait_s: float = 0.1
    #: New events of still-open episodes are written to the open-episodes table
    #: (one chunk per episode) at most this long after they arrive; only then are
    #: their offsets committed. Episodes that finish sooner are never written.
    persist_interval_s: float = 1.0

    def __post_init__(self) -> None:
        timeouts = (self.idle_timeout_s, self.quiet_partition_s, self.persist_interval_s)
        if min(*timeouts, self.batch_max_wait_s) <= 0:
            raise ValueError("assemble timeouts must be positive")
        if not 1 <= self.max_steps < 2**31:
            raise ValueError("assemble.max_steps must be in [1, 2**31)")
        if self.batch_max_events < 1:
            raise ValueError("assemble.batch_max_events must be positive")
        if self.max_episode_bytes < self.max_event_bytes:
            raise ValueError("assemble.max_episode_bytes must be >= assemble.max_event_bytes")
        if self.max_duration_s <= self.idle_timeout_s:
            raise ValueError("assemble.max_duration_s must exceed assemble.idle_timeout_s")
        lifetime = self.max_duration_s + self.idle_timeout_s + self.grace_s
        if self.window_expires_s < 2 * (lifetime + self.quiet_partition_s):
            raise ValueError(
                "assemble.window_expires_s must be at least twice max_duration_s + "
                "idle_timeout_s + grace_s + quiet_partition_s (it is only a backstop)"
            )
        if not 0 < self.window_s <= self.window_expires_s:
            raise ValueError("assemble.window_s must be positive and <= window_expires_s")
        if self.closed_retention_s < self.window_expires_s:
            raise ValueError("assemble.closed_retention_s must be >= window_expires_s")


class FormatSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: text (prompt/completion strings), conversational (TRL messages), episode,
    #: or a formatter registered under the stream_export.formatters entry point, or
    #: a dotted path "package.module:function".
    format: str = "text"
    #: One record per episode, or one per decision step.
    granularity: Literal["episode", "step"] = "episode"
    #: Metadata as top-level columns, nested under "metadata", or left out (the
    #: default: text records are then exactly the seed's {"prompt", "completion"}).
    #: The episode format always carries every field and ignores this.
    metadata_mode: Literal["columns", "nested", "none"] = "none"
    #: Which metadata fields to include; empty means the documented default set
    #: (formats.DEFAULT_METADATA_FIELDS). Names: episode_id, agent_id, group_id,
    #: outcome, reward, steps, duration, truncated, truncated_reason, start_time,
    #: end_time, decision (step granularity), or any key of the episode metadata.
    metadata_fields: list[str] = []
    #: Write only episodes whose outcome is "success".
    only_success: bool = False
    #: Write only episodes with at least / at most this many steps.
    min_steps: int | None = None
    max_steps: int | None = None
    #: Write only episodes with a reward of at least this (no reward: dropped).
    min_reward: float | None = None
    #: Keep only these domains (metadata "domain"); empty keeps all.
    domains: list[str] = []


class SinkSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    output_dir: str = "."
    prefix: str = "training-data"
    rotate_bytes: int = 256 * 1024 * 1024
    rotate_records: int = 0
    #: Seal the active file when it is this old (0 disables); idle files too.
    rotate_age_s: float = 3600.0
    #: How often buffered lines reach the file (tailers see them then).
    flush_interval_ms: int = 200
    #: When to fsync: every flush, at rotation only, or never.
    fsync: Literal["flush", "rotation", "never"] = "rotation"
    compression: Literal["none", "gzip", "zstd"] = "none"
    #: Optional metadata field whose value names a sub-folder (sanitised).
    partition_by: str | None = None
    #: Keep at most this many sealed files / bytes (0: no limit); only manifested
    #: sealed files are ever deleted, oldest first.
    retention_files: int = 0
    retention_bytes: int = 0
    #: How many recent episode ids the sink remembers to drop re-emitted episodes.
    dedupe_window: int = 100_000
    #: Longest pause between retries while the output is not writable.
    retry_max_s: float = 5.0
    #: When a topic is not the one whose offsets were kept (deleted and created
    #: again, or the broker's data wiped): "stop" with an error saying what to do,
    #: or "new_epoch": the sink seals its files and writes the new episodes topic
    #: from its beginning as a new epoch (in the manifest and checkpoint), and the
    #: assembler discards its stale local table state (its open episodes are lost).
    on_topic_reset: Literal["stop", "new_epoch"] = "stop"


class HttpSettings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    #: /metrics, /healthz, /readyz and the status page are served here.
    host: str = "127.0.0.1"
    port: int = 9108
    enabled: bool = True


class Settings(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    kafka: KafkaSettings = msgspec.field(default_factory=KafkaSettings)
    topics: TopicSettings = msgspec.field(default_factory=TopicSettings)
    worker: WorkerSettings = msgspec.field(default_factory=WorkerSettings)
    assemble: AssembleSettings = msgspec.field(default_factory=AssembleSettings)
    format: FormatSettings = msgspec.field(default_factory=FormatSettings)
    sink: SinkSettings = msgspec.field(default_factory=SinkSettings)
    http: HttpSettings = msgspec.field(default_factory=HttpSettings)

    def __post_init__(self) -> None:
        if not self.worker.worker_id:
            self.worker.worker_id = socket.gethostname()

    def sasl_password(self) -> Secret | None:
        """The SASL password from the setting or its file, wrapped as a Secret."""
        k = self.kafka
        if k.sasl_password_file:
            try:
                return Secret(Path(k.sasl_password_file).read_text().splitlines()[0])
            except (OSError, IndexError) as exc:
                raise ConfigError(f"cannot read sasl_password_file: {exc}") from None
        return Secret(k.sasl_password) if k.sasl_password is not None else None

    def redacted(self) -> dict[str, Any]:
        """The settings as a dict with secrets replaced, safe to log."""
        data: dict[str, Any] = msgspec.to_builtins(self)
        if data["kafka"].get("sasl_password") is not None:
            data["kafka"]["sasl_password"] = "***"
        return data


def _sections() -> dict[str, type[msgspec.Struct]]:
    return {f.name: f.type for f in msgspec.structs.fields(Settings)}


def env_names() -> list[str]:
    """Every environment variable the settings read, in a stable order."""
    names = []
    for section, cls in _sections().items():
        for f in msgspec.structs.fields(cls):
            names.append(f"{ENV_PREFIX}{section}_{f.name}".upper())
    return names


def _coerce(raw: str, annotation: Any) -> Any:
    """Env and flag values are strings; lists are comma-separated."""
    text = str(annotation)
    if text.startswith("list["):
        return [part.strip() for part in raw.split(",") if part.strip()]
    if raw == "" and "None" in text:
        return None
    return raw


def _overrides(pairs: Iterable[tuple[str, str]]) -> dict[str, dict[str, Any]]:
    sections = _sections()
    out: dict[str, dict[str, Any]] = {}
    for key, raw in pairs:
        section, _, field = key.partition(".")
        cls = sections.get(section)
        fields = {f.name: f.type for f in msgspec.structs.fields(cls)} if cls else {}
        if field not in fields:
            raise ConfigError(f"unknown setting {key!r}")
        out.setdefault(section, {})[field] = _coerce(raw, fields[field])
    return out


def _merge(base: dict[str, Any], extra: Mapping[str, Mapping[str, Any]]) -> None:
    for section, values in extra.items():
        base.setdefault(section, {}).update(values)


def load(
    *,
    file: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Iterable[str] = (),
) -> Settings:
    """Build Settings from a TOML file, the environment and ``section.field=value`` flags."""
    env = os.environ if env is None else env
    data: dict[str, Any] = {}
    file = file or env.get(f"{ENV_PREFIX}CONFIG")
    if file:
        try:
            with open(file, "rb") as fh:
                _merge(data, tomllib.load(fh))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config file {file}: {exc}") from None
    env_pairs = []
    for section, cls in _sections().items():
        for f in msgspec.structs.fields(cls):
            name = f"{ENV_PREFIX}{section}_{f.name}".upper()
            if name in env:
                env_pairs.append((f"{section}.{f.name}", env[name]))
    _merge(data, _overrides(env_pairs))
    flag_pairs = []
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep:
            raise ConfigError(f"--set expects section.field=value, got {item!r}")
        flag_pairs.append((key.strip(), value))
    _merge(data, _overrides(flag_pairs))
    try:
        return msgspec.convert(data, Settings, strict=False)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"invalid setting: {exc}") from None
