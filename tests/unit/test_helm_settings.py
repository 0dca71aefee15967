"""The chart and the settings: every environment variable the chart sets is a
setting the worker reads and loads, the values schema is generated from the code,
and a misspelled or out-of-range setting fails the render."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_export import settings
from stream_export.settings.values import ENV_PREFIX
from tests.support import helm_schema
from tests.support.helm_chart import VALUES, env, render, template, worker
from tests.support.monitoring import CHART


def test_schema_rejects_bad_values() -> None:
    for bad in (
        "replicaCount=0",
        "kafka.securityProtocol=SASL",
        "nope=1",
        "settings.nosection.x=1",
    ):
        done = template("--set", bad)
        assert done.returncode != 0, bad
        assert "schema" in done.stderr, done.stderr


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_every_environment_variable_is_a_setting_the_worker_reads(values: Path) -> None:
    _, container = worker(render(values))
    names = [n for n in env(container) if n.startswith(ENV_PREFIX)]
    assert names and len(names) == len(set(names))
    unknown = set(names) - set(settings.env_names())
    assert not unknown, f"{values.name}: not settings: {sorted(unknown)}"


def test_the_settings_schema_is_generated_from_the_code() -> None:
    assert json.loads(helm_schema.SCHEMA.read_text()) == helm_schema.generated(), (
        "values.schema.json is stale: run python -m tests.support.helm_schema"
    )


def test_every_setting_is_a_settings_key_or_set_by_the_chart() -> None:
    allowed = {
        f"{section}.{field}"
        for section, node in helm_schema.settings_schema()["properties"].items()
        for field in node["properties"]
    }
    for key in settings.field_types():
        by_chart = helm_schema.chart_sets(key)
        assert (key in allowed) + by_chart + (key in helm_schema.NEVER) == 1, key
    assert all(helm_schema.chart_sets(key) for key in helm_schema.VALUES.values())


@pytest.mark.parametrize(
    ("bad", "named"),
    [
        ("settings.sink.rotate_byts=1", "'rotate_byts' not allowed"),
        ("settings.snik.rotate_bytes=1", "'snik' not allowed"),
        ("settings.sink.output_dir=/x", "'output_dir' not allowed"),  # the chart sets it
        ("settings.kafka.sasl_password=pw", "'sasl_password' not allowed"),
        ("settings.sink.rotate_bytes=-1", "/settings/sink/rotate_bytes"),
        ("settings.sink.flush_interval_ms=fast", "/settings/sink/flush_interval_ms"),
        ("settings.sink.fsync=sometimes", "/settings/sink/fsync"),
        ("topics.partitions=0", "/topics/partitions"),
        ("http.port=70000", "/http/port"),
        ("http.probePort=0", "/http/probePort"),
        ("settings.http.probe_port=9109", "'probe_port' not allowed"),  # the chart sets it
    ],
)
def test_a_misspelled_or_out_of_range_setting_fails_the_render(bad: str, named: str) -> None:
    done = template("--set", bad)
    assert done.returncode != 0 and "schema" in done.stderr, done.stderr
    assert named in done.stderr, done.stderr


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_the_rendered_environment_loads(values: Path) -> None:
    _, container = worker(render(values))
    wanted = {k: v for k, v in env(container).items() if k.startswith(ENV_PREFIX)}
    settings.load(env={k: v for k, v in wanted.items() if v is not None})


def test_values_within_the_bounds_render_and_load() -> None:
    sets = ("settings.sink.rotate_bytes=0", "settings.sink.flush_interval_ms=60000")
    _, container = worker(render(None, *sets, "settings.format.min_reward=-0.5"))
    e = {k: v for k, v in env(container).items() if v is not None}
    s = settings.load(env={k: v for k, v in e.items() if k.startswith(ENV_PREFIX)})
    assert (s.sink.rotate_bytes, s.sink.flush_interval_ms, s.format.min_reward) == (0, 60000, -0.5)


def test_settings_pass_through_as_strings_the_worker_parses() -> None:
    _, container = worker(render(CHART / "ci" / "settings-values.yaml"))
    e = env(container)
    wanted = {k: v for k, v in e.items() if k.startswith(ENV_PREFIX) and v is not None}
    s = settings.load(env=wanted)
    assert s.sink.rotate_bytes == 134217728 and s.sink.compression == "gzip"
    assert s.format.domains == ["math", "text-adventure"]
    assert s.topics.partitions == 8 and s.worker.log_level == "debug"
    assert (s.sink.output_dir, s.worker.data_dir, s.http.host) == ("/data", "/state", "0.0.0.0")
