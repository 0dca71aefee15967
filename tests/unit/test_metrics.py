"""Metric names and the pure parts behind /metrics, /readyz and the status page."""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from stream_export import __version__, http, lag
from stream_export.metrics import Metrics


def families(m: Metrics) -> dict[str, str]:
    text = generate_latest(m.registry).decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_names_follow_prometheus_conventions() -> None:
    text = generate_latest(Metrics().registry).decode()
    assert "_total_total" not in text
    for name, kind in families(Metrics()).items():
        assert name.startswith("stream_export_"), name
        assert not name.endswith("_total"), f"{name}: the client library appends _total"
        if kind == "histogram":
            units = ("_seconds", "_steps", "_rollouts", "_reward_spread")
            assert name.endswith(units), f"{name}: base unit missing"
    assert "stream_export_consumer_lag_messages" in families(Metrics())


def test_every_metric_is_on_the_injected_registry_only() -> None:
    registry = CollectorRegistry()
    a, b = Metrics(registry), Metrics()
    a.records_written.inc(3)
    assert registry.get_sample_value("stream_export_records_written_total") == 3
    assert b.registry.get_sample_value("stream_export_records_written_total") == 0


def test_build_info_names_the_version() -> None:
    value = Metrics().registry.get_sample_value(
        "stream_export_build_info", {"version": __version__}
    )
    assert value == 1


def test_lag_is_end_minus_committed_per_partition() -> None:
    ends = {("steps", 0): 120, ("steps", 1): 50, ("episodes", 0): 7}
    committed = {("steps", 0): 100, ("steps", 1): -1}
    assert lag.compute(ends, committed) == {("steps", 0): 20, ("steps", 1): 50, ("episodes", 0): 7}
    assert lag.compute({("s", 0): 5}, {("s", 0): 9}) == {("s", 0): 0}


def test_totals_and_labels_sum_across_label_values() -> None:
    m = Metrics()
    m.events_consumed.labels("step").inc(5)
    m.events_consumed.labels("end").inc(2)
    m.dead_letters.labels("not_json").inc()
    everything = http.collect(m.registry)
    assert http.total(everything, "stream_export_events_consumed_total") == 7
    assert http.by_label(everything, "stream_export_dead_letters_total", "reason") == {
        "not_json": 1
    }
    status = http.collect(m.registry, http.STATUS_FAMILIES)
    assert http.total(status, "stream_export_events_consumed_total") == 7
    assert "stream_export_end_to_end_seconds_bucket" in everything
    assert "stream_export_end_to_end_seconds_bucket" not in status


def test_throughput_is_a_rate_over_the_window() -> None:
    m = Metrics()
    t = http.Throughput(m.registry, window_s=10)
    assert t.rates()["events_per_s"] == 0
    t.sample(now=100.0)
    m.events_consumed.labels("step").inc(50)
    m.records_written.inc(5)
    t.sample(now=105.0)
    assert t.rates() == {"events_per_s": 10.0, "records_per_s": 1.0, "bytes_per_s": 0.0}
    for second in range(106, 130):
        t.sample(now=float(second))
    assert t.rates()["events_per_s"] == 0  # old samples age out of the window
    assert len(t.points) <= 12


def test_readiness_needs_every_check() -> None:
    ready = {"assigned": True, "rebalancing": False, "recovered": True, "paused": 0.0}
    ready |= {"writable": True, "kafka_reachable": True}
    assert all(http.readiness(**ready).values())  # type: ignore[arg-type]
    for change in (
        {"assigned": False},
        {"rebalancing": True},
        {"recovered": False},
        {"paused": 1},
        {"writable": False},
        {"kafka_reachable": False},
    ):
        args = ready | change
        checks = http.readiness(**args)
        assert not all(checks.values()), change


def test_output_writable_needs_a_directory(tmp_path: Path) -> None:
    assert http.writable(str(tmp_path))
    assert http.writable(str(tmp_path / "not" / "yet" / "created"))
    afile = tmp_path / "a-file"
    afile.write_text("x")
    assert not http.writable(str(afile))
    assert not http.writable(str(afile / "below-a-file"))


def test_recent_records_are_short_previews_of_the_newest_file(tmp_path: Path) -> None:
    assert http.recent_records(str(tmp_path)) == []
    old = tmp_path / "old.jsonl"
    old.write_text('{"old": 1}\n')
    os.utime(old, (1, 1))
    sub = tmp_path / "domain=math"
    sub.mkdir()
    lines = [f'{{"n": {i}, "text": "{"x" * 500}"}}' for i in range(20)]
    (sub / "training-data.jsonl").write_text("\n".join(lines) + "\n" + '{"partial": ')
    got = http.recent_records(str(tmp_path), n=3)
    assert [r["preview"][:8] for r in got] == ['{"n": 19', '{"n": 18', '{"n": 17']
    assert all(len(r["preview"]) == http.PREVIEW_CHARS for r in got)
    assert got[0]["bytes"] == len(lines[19]) + 1 and got[0]["file"] == "training-data.jsonl"


def test_recent_records_reads_only_the_tail_of_a_big_file(tmp_path: Path) -> None:
    line = b'{"k": "' + b"y" * 1000 + b'"}\n'
    (tmp_path / "big.jsonl").write_bytes(line * 2000)
    got = http.recent_records(str(tmp_path), n=100)
    assert 0 < len(got) <= 64 and all(r["bytes"] == len(line) for r in got)
