from __future__ import annotations

import json
import math
import re
import typing
from pathlib import Path
from typing import Literal

import msgspec
import pytest

from stream_export import settings
from stream_export.errors import ConfigError, StreamExportError
from stream_export.settings import values


def _numeric(annotation: object) -> bool:
    return values.unwrap(annotation)[0] in (int, float)


def test_defaults_write_the_seed_default_path() -> None:
    s = settings.load(env={})
    assert (s.sink.output_dir, s.sink.prefix) == (".", "training-data")
    assert s.sink.flush_interval_ms <= 200


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('[sink]\nprefix = "from-file"\nrotate_records = 5\n[topics]\npartitions = 3\n')
    env = {"STREAM_EXPORT_SINK_PREFIX": "from-env", "STREAM_EXPORT_TOPICS_PARTITIONS": "6"}
    s = settings.load(file=f, env=env, overrides=["topics.partitions=8"])
    assert s.sink.prefix == "from-env"
    assert s.sink.rotate_records == 5
    assert s.topics.partitions == 8


def test_lists_and_optionals_from_strings() -> None:
    s = settings.load(env={"STREAM_EXPORT_FORMAT_DOMAINS": "math, games"})
    assert s.format.domains == ["math", "games"]
    assert settings.load(env={"STREAM_EXPORT_SINK_PARTITION_BY": ""}).sink.partition_by is None


@pytest.mark.parametrize(
    ("override", "allowed"),
    [
        ("sink.rotate_bytes=-1", "an integer from 0 to 1099511627776"),
        ("sink.flush_interval_ms=0", "an integer from 1 to 60000"),
        ("sink.rotate_records=-1", "an integer from 0 to 2147483647"),
        ("sink.rotate_age_s=-1", "a number from 0 to 315360000"),
        ("sink.retry_max_s=0", "a number > 0 and <= 3600"),
        ("sink.retention_files=-1", "an integer from 0 to 10000000"),
        ("sink.dedupe_window=-1", "an integer from 0 to 10000000"),
        ("topics.partitions=0", "an integer from 1 to 10000"),
        ("topics.partitions=many", "an integer from 1 to 10000"),
        ("topics.replication_factor=0", "an integer from 1 to 32767"),
        ("worker.session_timeout_s=-5", "a number from 6 to 1800"),
        ("assemble.max_event_bytes=0", "an integer from 1 to 1073741824"),
        ("assemble.idle_timeout_s=inf", "a number > 0 and <= 2592000"),
        ("http.port=70000", "an integer from 1 to 65535"),
        ("sink.fsync=sometimes", "one of flush, rotation, never"),
        ("worker.log_json=yes", "true or false"),
        ("format.min_reward=nan", "a finite number, or empty for none"),
        ("sink.prefix=../etc", "1-128 letters, digits, '.', '_' or '-', starting with a letter"),
        ("worker.worker_id=a/b", "empty (the host name) or 1-128 letters, digits"),
        ("topics.steps=.hidden", "a topic name: 1-249 letters"),
        ("kafka.bootstrap_servers=a b", "a comma-separated list of host:port"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_setting_and_the_range(
    override: str, allowed: str
) -> None:
    key, _, value = override.partition("=")
    with pytest.raises(ConfigError) as info:
        settings.load(env={}, overrides=[override])
    message = str(info.value)
    assert isinstance(info.value, StreamExportError)
    shown = json.dumps(value) if " " in value else value
    assert f"invalid setting {key}={shown}: must be {allowed}" in message
    assert message.endswith("(from --set)")
    assert "\n" not in message and len(message.splitlines()) == 1


def test_every_setting_is_bounded_by_its_type() -> None:
    """Numbers have a lower and an upper bound, strings a pattern or a length,
    everything else is a closed choice: no value outside the documented range loads."""

    def bounded(annotation: object) -> bool:
        bare, _, meta = values.unwrap(annotation)
        if typing.get_origin(bare) is list:
            return bounded(typing.get_args(bare)[0])
        if bare in (int, float):
            low = meta.ge if meta.ge is not None else meta.gt
            return low is not None and meta.le is not None
        if bare is str:
            return meta.pattern is not None or meta.max_length is not None
        return bare in (bool, values.Secret) or typing.get_origin(bare) is Literal

    loose = [key for key, t in settings.field_types().items() if not bounded(t)]
    assert not loose


@pytest.mark.parametrize("key", [k for k, t in settings.field_types().items() if _numeric(t)])
def test_just_outside_each_numeric_bound_is_refused(key: str) -> None:
    _, _, meta = values.unwrap(settings.field_types()[key])
    assert meta.le is not None
    below = meta.ge - 1 if meta.ge is not None else meta.gt
    if below == meta.ge:  # -float_max - 1 rounds back to -float_max
        below = -math.inf
    for value in (below, meta.le * 2 + 1):
        with pytest.raises(ConfigError, match=rf"invalid setting {re.escape(key)}=.*: must be"):
            settings.load(env={}, overrides=[f"{key}={value}"])


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "assemble.max_episode_bytes=10",
            "invalid setting assemble.max_episode_bytes=10: must be >= "
            "assemble.max_event_bytes (1048576)",
        ),
        (
            "assemble.max_duration_s=300",
            "invalid setting assemble.max_duration_s=300: must be > assemble.idle_timeout_s (300)",
        ),
        (
            "format.min_steps=9",
            "invalid setting format.min_steps=9: must be <= format.max_steps (3)",
        ),
        (
            "http.probe_port=9108",
            "invalid setting http.probe_port=9108: must differ from http.port (9108)",
        ),
        (
            "kafka.bootstrap_servers=a:1,b:70000",
            "invalid setting kafka.bootstrap_servers=a:1,b:70000: "
            "port 70000 must be from 1 to 65535",
        ),
    ],
)
def test_cross_field_checks_read_the_same(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        settings.load(env={}, overrides=["format.max_steps=3", override])
    assert info.value.detail == message


def test_unknown_names_are_errors_from_every_source(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        settings.load(env={"STREAM_EXPORT_SINK_ROTATE_BYTS": "1"})
    assert info.value.detail == (
        "unknown setting STREAM_EXPORT_SINK_ROTATE_BYTS (environment); "
        "did you mean STREAM_EXPORT_SINK_ROTATE_BYTES?"
    )
    with pytest.raises(ConfigError, match=r"unknown setting sink\.nope \(from --set\)"):
        settings.load(env={}, overrides=["sink.nope=1"])
    with pytest.raises(ConfigError, match=r"unknown setting nosection\.x"):
        settings.load(env={}, overrides=["nosection.x=1"])
    f = tmp_path / "s.toml"
    f.write_text("[sink]\nrotate_recrods = 5\n")
    with pytest.raises(ConfigError) as info:
        settings.load(file=f, env={})
    assert info.value.detail == (
        f"unknown setting sink.rotate_recrods (from {f}); did you mean sink.rotate_records?"
    )
    f.write_text("sink = 5\n")
    with pytest.raises(ConfigError, match=r"must be a \[sink\] table"):
        settings.load(file=f, env={})


def test_the_config_file_variable_is_the_one_extra_name(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text("[sink]\nrotate_records = -3\n")
    with pytest.raises(ConfigError) as info:
        settings.load(env={"STREAM_EXPORT_CONFIG": str(f)})
    assert info.value.detail == (
        f"invalid setting sink.rotate_records=-3: must be an integer from 0 to 2147483647 "
        f"(from {f})"
    )
    env = {"STREAM_EXPORT_CONFIG": str(f), "STREAM_EXPORT_SINK_ROTATE_RECORDS": "7"}
    assert settings.load(env=env).sink.rotate_records == 7
    with pytest.raises(ConfigError, match="from STREAM_EXPORT_HTTP_PORT"):
        settings.load(env={"STREAM_EXPORT_HTTP_PORT": "0"})


def test_zero_is_allowed_where_it_means_off() -> None:
    s = settings.load(
        env={},
        overrides=[
            f"sink.{field}=0"
            for field in ("rotate_bytes", "rotate_records", "rotate_age_s", "dedupe_window")
        ]
        + ["sink.retention_files=0", "sink.retention_bytes=0", "assemble.grace_s=0"],
    )
    assert (s.sink.rotate_bytes, s.sink.dedupe_window, s.assemble.grace_s) == (0, 0, 0)


def test_a_value_in_an_error_is_one_short_line() -> None:
    with pytest.raises(ConfigError) as info:
        settings.load(env={}, overrides=["sink.prefix=a\nb" + "x" * 200])
    message = str(info.value)
    assert len(message.splitlines()) == 1 and len(message) < 300
    assert 'sink.prefix="a\\nb' in message


def test_secrets_never_show(tmp_path: Path) -> None:
    s = settings.load(env={"STREAM_EXPORT_KAFKA_SASL_PASSWORD": "hunter2"})
    assert isinstance(s.kafka.sasl_password, values.Secret)
    for text in (repr(s), str(s), repr(s.kafka), f"{s.kafka.sasl_password}", str(s.redacted())):
        assert "hunter2" not in text
    assert s.redacted()["kafka"]["sasl_password"] == "***"
    with pytest.raises(TypeError) as info:  # no silent clear-text dump either
        msgspec.to_builtins(s)
    assert "hunter2" not in str(info.value)
    secret = s.sasl_password()
    assert secret is not None and secret.reveal() == "hunter2"
    pw = tmp_path / "pw"
    pw.write_text("from-file\n")
    s2 = settings.load(env={"STREAM_EXPORT_KAFKA_SASL_PASSWORD_FILE": str(pw)})
    from_file = s2.sasl_password()
    assert from_file is not None and from_file.reveal() == "from-file"
    assert "from-file" not in repr(from_file)


@pytest.mark.parametrize("toml", ["sasl_password = 12345678\n", 'sasl_password = ["hunter2"]\n'])
def test_a_bad_secret_value_is_never_echoed(tmp_path: Path, toml: str) -> None:
    f = tmp_path / "s.toml"
    f.write_text("[kafka]\n" + toml)
    with pytest.raises(ConfigError) as info:
        settings.load(file=f, env={})
    assert info.value.detail == (
        f"invalid setting kafka.sasl_password=***: must be a string, or empty for none (from {f})"
    )
    assert "12345678" not in str(info.value) and "hunter2" not in str(info.value)
    with pytest.raises(ConfigError) as unknown:  # a misspelled name never shows its value
        settings.load(env={}, overrides=["kafka.sasl_pasword=hunter2"])
    assert "hunter2" not in str(unknown.value) and "kafka.sasl_password" in str(unknown.value)


def test_env_names_cover_every_field() -> None:
    names = settings.env_names()
    assert "STREAM_EXPORT_SINK_OUTPUT_DIR" in names
    assert "STREAM_EXPORT_KAFKA_BOOTSTRAP_SERVERS" in names
    assert len(names) == len(set(names))
