"""The real ``stream-export worker`` with a bad setting: exit 2 with one line naming the
setting and its range, before it tries Kafka (the address given has no listener, so
reaching the Kafka check would print ``kafka_unavailable`` instead)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stream_export import settings
from stream_export.errors import ConfigError
from stream_export.settings import values
from tests.support.monitoring import free_port

CLI = Path(sys.executable).with_name("stream-export")


def worker(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(values.ENV_PREFIX)}
    began = time.monotonic()
    done = subprocess.run(
        [str(CLI), "worker", "--bootstrap-servers", f"127.0.0.1:{free_port()}", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        env={**clean, **(env or {})},
    )
    assert done.stdout == ""
    return done.returncode, done.stderr, time.monotonic() - began


RANGE = "must be an integer from 0 to 1099511627776"


@pytest.mark.parametrize(
    ("source", "line"),
    [
        ("flag", f"invalid setting sink.rotate_bytes=-1: {RANGE} (from --set)"),
        (
            "env",
            f"invalid setting sink.rotate_bytes=-1: {RANGE} (from STREAM_EXPORT_SINK_ROTATE_BYTES)",
        ),
        ("toml", f"invalid setting sink.rotate_bytes=-1: {RANGE} (from settings.toml)"),
        (
            "misspelled env",
            "unknown setting STREAM_EXPORT_SINK_ROTATE_BYTS (environment); "
            "did you mean STREAM_EXPORT_SINK_ROTATE_BYTES?",
        ),
        (
            "port",
            "invalid setting http.port=70000: must be an integer from 1 to 65535 (from --set)",
        ),
        (
            "unsafe worker id",
            "invalid setting worker.worker_id=../w: must be empty (the host name) or 1-128 "
            "letters, digits, '.', '_' or '-', starting with a letter or digit (from --set)",
        ),
    ],
)
def test_a_bad_setting_stops_the_worker_with_one_line_before_kafka(
    tmp_path: Path, source: str, line: str
) -> None:
    (tmp_path / "settings.toml").write_text("[sink]\nrotate_bytes = -1\n")
    args, env = {
        "flag": (["--set", "sink.rotate_bytes=-1"], {}),
        "env": ([], {"STREAM_EXPORT_SINK_ROTATE_BYTES": "-1"}),
        "toml": (["--config", "settings.toml"], {}),
        "misspelled env": ([], {"STREAM_EXPORT_SINK_ROTATE_BYTS": "1"}),
        "port": (["--set", "http.port=70000"], {}),
        "unsafe worker id": (["--set", "worker.worker_id=../w"], {}),
    }[source]
    rc, stderr, took = worker(tmp_path, *args, env=env)
    assert rc == 2, stderr
    assert stderr.splitlines() == [f"stream-export: config: {line}"]
    assert took < 10, f"took {took:.1f}s"
    assert not (tmp_path / ".stream-export").exists()  # nothing started


def test_a_good_setting_gets_as_far_as_kafka(tmp_path: Path) -> None:
    """The control: the same command with valid settings reaches the Kafka check."""
    rc, stderr, _ = worker(tmp_path, "--set", "sink.rotate_bytes=0")
    assert rc == 2 and "kafka_unavailable: cannot reach Kafka" in stderr, stderr


@pytest.mark.parametrize(
    "env", [{"STREAM_EXPORT_SINK_ROTATE_BYTES": "-1"}, {"STREAM_EXPORT_SINK_ROTATE_BYTS": "1"}]
)
def test_the_docs_show_the_lines_an_operator_sees(env: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        settings.load(env=env)
    readme = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    assert f"    stream-export: {info.value}\n" in readme
