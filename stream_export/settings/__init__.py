"""The one settings object, loaded from defaults < TOML file < environment < flags.

Each section is a struct of its own module (``settings/kafka.py`` is ``kafka.*``, and
so on); this module puts them together as :class:`Settings`, checks what spans
sections, and loads it. Every field is typed and documented in its section, and its
bounds are part of its type (``msgspec.Meta`` constraints, ``Literal`` choices,
patterns), so ``load`` refuses a bad value before anything starts: the first
mistake becomes a one-line ConfigError naming the setting, the value and what is
allowed, for example ``invalid setting sink.rotate_bytes=-1: must be an integer
from 0 to 1099511627776 (from --set)``. The environment variable for a field is
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
from typing import Any

import msgspec

from stream_export.errors import ConfigError
from stream_export.settings.assemble import AssembleSettings
from stream_export.settings.format import FormatSettings
from stream_export.settings.gateway import GatewaySettings
from stream_export.settings.groups import GroupSettings
from stream_export.settings.http import HttpSettings
from stream_export.settings.kafka import KafkaSettings
from stream_export.settings.scores import ScoreSettings
from stream_export.settings.sink import SinkSettings
from stream_export.settings.topics import TopicSettings
from stream_export.settings.values import Secret, convert, did_you_mean, env_name, read_sources
from stream_export.settings.weights import WeightSettings
from stream_export.settings.worker import WorkerSettings


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
    weights: WeightSettings = msgspec.field(default_factory=WeightSettings)

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
