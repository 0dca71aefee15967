from __future__ import annotations

from pathlib import Path

import pytest

from stream_export import config
from stream_export.errors import ConfigError, StreamExportError


def test_defaults_write_the_seed_default_path() -> None:
    s = config.load(env={})
    assert (s.sink.output_dir, s.sink.prefix) == (".", "training-data")
    assert s.sink.flush_interval_ms <= 200


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    f = tmp_path / "s.toml"
    f.write_text('[sink]\nprefix = "from-file"\nrotate_records = 5\n[topics]\npartitions = 3\n')
    env = {"STREAM_EXPORT_SINK_PREFIX": "from-env", "STREAM_EXPORT_TOPICS_PARTITIONS": "6"}
    s = config.load(file=f, env=env, overrides=["topics.partitions=8"])
    assert s.sink.prefix == "from-env"
    assert s.sink.rotate_records == 5
    assert s.topics.partitions == 8


def test_lists_and_optionals_from_strings() -> None:
    s = config.load(env={"STREAM_EXPORT_FORMAT_DOMAINS": "math, games"})
    assert s.format.domains == ["math", "games"]
    assert config.load(env={"STREAM_EXPORT_SINK_PARTITION_BY": ""}).sink.partition_by is None


@pytest.mark.parametrize(
    "override", ["sink.nope=1", "nosection.x=1", "topics.partitions=many", "sink.fsync=sometimes"]
)
def test_bad_settings_raise_config_error(override: str) -> None:
    with pytest.raises(ConfigError) as info:
        config.load(env={}, overrides=[override])
    assert isinstance(info.value, StreamExportError)


def test_secrets_never_show(tmp_path: Path) -> None:
    s = config.load(env={"STREAM_EXPORT_KAFKA_SASL_PASSWORD": "hunter2"})
    assert "hunter2" not in repr(s.redacted())
    secret = s.sasl_password()
    assert secret is not None and "hunter2" not in repr(secret)
    assert secret.reveal() == "hunter2"
    pw = tmp_path / "pw"
    pw.write_text("from-file\n")
    s2 = config.load(env={"STREAM_EXPORT_KAFKA_SASL_PASSWORD_FILE": str(pw)})
    assert s2.sasl_password() == "from-file"


def test_env_names_cover_every_field() -> None:
    names = config.env_names()
    assert "STREAM_EXPORT_SINK_OUTPUT_DIR" in names
    assert "STREAM_EXPORT_KAFKA_BOOTSTRAP_SERVERS" in names
    assert len(names) == len(set(names))
