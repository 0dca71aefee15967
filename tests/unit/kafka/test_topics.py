"""Topic specs and the committed JSON Schemas, without a broker."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stream_export import cli
from stream_export.contract.events import SCHEMA_VERSION
from stream_export.contract.topics import SCHEMA_DIR, load_specs, schema_documents, stale_schemas
from stream_export.errors import ConfigError
from stream_export.kafka import topics
from stream_export.settings import load
from stream_export.settings.assemble import AssembleSettings
from stream_export.settings.topics import TopicSettings

SPECS = Path(__file__).resolve().parents[3] / "topics"


def test_the_committed_json_schemas_match_the_code() -> None:
    stale = stale_schemas(SPECS / SCHEMA_DIR)
    assert not stale, f"regenerate with `stream-export topics schemas`: {stale}"


def test_schemas_check_command_fails_on_drift(tmp_path: Path) -> None:
    assert cli.main(["topics", "schemas", "--check", "--dir", str(tmp_path)]) == 1
    assert cli.main(["topics", "schemas", "--dir", str(tmp_path)]) == 0
    assert cli.main(["topics", "schemas", "--check", "--dir", str(tmp_path)]) == 0
    schema = tmp_path / f"step-event.v{SCHEMA_VERSION}.schema.json"
    schema.write_text(schema.read_text().replace('"minimum": 0', '"minimum": 1'))
    assert cli.main(["topics", "schemas", "--check", "--dir", str(tmp_path)]) == 1


def test_the_step_event_schema_describes_the_union() -> None:
    schema = json.loads(schema_documents()[f"step-event.v{SCHEMA_VERSION}.schema.json"])
    assert set(schema["discriminator"]["mapping"]) == {"start", "step", "end", "score"}
    step = schema["$defs"]["Step"]
    assert {"type", "episode_id", "time", "seq", "kind"} <= set(step["required"])
    assert "v" in step["properties"]


def test_one_spec_per_topic_with_names_matching_the_setting_defaults() -> None:
    specs = load_specs(SPECS)
    assert [s.role for s in specs] == ["steps", "episodes", "dead_letters"]
    defaults = TopicSettings()
    for spec in specs:
        assert spec.name == getattr(defaults, spec.role)
        assert spec.key and spec.value and spec.description
        assert spec.config["cleanup.policy"] in {"delete", "compact"}
        assert "retention.ms" in spec.config
        if spec.value_schema:
            assert (SPECS / spec.value_schema).is_file()


def test_message_size_limits_fit_the_largest_messages_the_settings_allow() -> None:
    specs = {s.role: s for s in load_specs(SPECS)}
    limits = AssembleSettings()
    assert int(specs["steps"].config["max.message.bytes"]) > limits.max_event_bytes
    for role in ("episodes", "dead_letters"):
        assert int(specs[role].config["max.message.bytes"]) > limits.max_episode_bytes


def test_the_worker_tables_source_topics_take_partitions_from_the_settings() -> None:
    settings = load(
        env={},
        overrides=["topics.steps=s", "topics.episodes=e", "topics.partitions=7"],
    )
    want = {w.role: w for w in topics.wanted(settings, load_specs(SPECS))}
    assert (want["steps"].name, want["steps"].partitions) == ("s", 7)
    assert (want["episodes"].name, want["episodes"].partitions) == ("e", 7)
    assert want["steps"].copartitioned and want["episodes"].copartitioned
    assert want["steps"].replication_factor == settings.topics.replication_factor


def test_two_roles_on_one_topic_is_a_config_error() -> None:
    settings = load(env={}, overrides=["topics.dead_letters=agent-steps"])
    with pytest.raises(ConfigError, match="must differ"):
        topics.wanted(settings, load_specs(SPECS))


def test_a_bad_or_incomplete_spec_folder_is_a_config_error(tmp_path: Path) -> None:
    (tmp_path / "steps.toml").write_text((SPECS / "steps.toml").read_text())
    with pytest.raises(ConfigError, match="one spec per topic"):
        load_specs(tmp_path)
    (tmp_path / "steps.toml").write_text('role = "steps"\nnmae = "typo"\n')
    with pytest.raises(ConfigError, match=r"steps\.toml"):
        load_specs(tmp_path)


WANT = topics.Wanted(
    role="steps",
    name="s",
    partitions=4,
    replication_factor=1,
    copartitioned=True,
    config={"cleanup.policy": "delete", "retention.ms": "1000"},
)


def test_a_matching_topic_has_no_drift() -> None:
    have = topics.Actual(4, 1, {"cleanup.policy": "delete", "retention.ms": "1000", "x": "y"})
    assert topics.compare(WANT, have) == []


def test_drift_in_partitions_replication_and_configs_is_reported() -> None:
    have = topics.Actual(8, 3, {"cleanup.policy": "compact"})
    drift = {d.setting: d for d in topics.compare(WANT, have)}
    assert set(drift) == {"partitions", "replication_factor", "cleanup.policy", "retention.ms"}
    assert drift["partitions"].fatal, "a table source with other partitions breaks faust"
    assert not drift["retention.ms"].fatal
    assert (drift["retention.ms"].want, drift["retention.ms"].have) == ("1000", "(unset)")
    assert "partitions is 8, spec wants 4" in str(drift["partitions"])


def test_partition_drift_is_harmless_on_a_topic_without_tables() -> None:
    dlq = topics.Wanted("dead_letters", "d", 4, 1, False, {})
    (drift,) = topics.compare(dlq, topics.Actual(2, 1, {}))
    assert not drift.fatal


def test_render_lists_every_topic_and_its_drift() -> None:
    text = topics.render(
        [
            topics.TopicStatus("steps", "s", "drift", [topics.Drift("partitions", "4", "8", True)]),
            topics.TopicStatus("episodes", "e", "created"),
        ]
    )
    assert text.splitlines() == [
        "s (steps): drift",
        "  partitions is 8, spec wants 4 (fatal for the worker)",
        "e (episodes): created",
    ]


def test_the_worker_topics_take_the_largest_record_the_settings_allow() -> None:
    """max.message.bytes (and segments of four such records) follow
    assemble.max_episode_bytes on every topic the worker writes, the repartition
    topic included, which is deleted by time, never compacted."""
    s = load(env={}, overrides=["groups.enabled=true", "assemble.max_episode_bytes=50000000"])
    want = {w.role: w.config for w in topics.wanted(s, load_specs(SPECS))}
    need = s.assemble.max_message_bytes
    for role in ("episodes", "dead_letters", "groups", "groups_by_group"):
        assert int(want[role]["max.message.bytes"]) == need >= s.assemble.max_record_bytes
        assert int(want[role]["segment.bytes"]) >= 4 * need
    assert want["groups_by_group"]["cleanup.policy"] == "delete"
    assert int(want["steps"]["max.message.bytes"]) > s.assemble.max_event_bytes


def test_a_worker_topic_too_small_for_its_records_is_fatal_drift() -> None:
    episodes = topics.Wanted(
        "episodes", "e", 4, 1, True, {"max.message.bytes": "16842752", "segment.bytes": "67371008"}
    )
    steps = topics.Wanted("steps", "s", 4, 1, True, {"max.message.bytes": "1114112"})
    small = {"max.message.bytes": "1048588", "segment.bytes": "16777216"}
    drift = {d.setting: d for d in topics.compare(episodes, topics.Actual(4, 1, small))}
    assert drift.keys() == {"max.message.bytes", "segment.bytes"}
    assert all(d.fatal for d in drift.values())
    large = {"max.message.bytes": "33554432", "segment.bytes": "1073741824"}
    assert topics.compare(episodes, topics.Actual(4, 1, large)) == []  # room to spare
    (steps_drift,) = topics.compare(steps, topics.Actual(4, 1, small))
    assert not steps_drift.fatal  # agents' events are refused, the worker is not hurt
