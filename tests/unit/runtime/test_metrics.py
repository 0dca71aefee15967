"""Metric names and the pure parts behind /metrics, /readyz and the status page."""

from __future__ import annotations

import ast
import math
import os
import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import stream_export
from stream_export import __version__
from stream_export.contract import events
from stream_export.contract.reasons import DeadLetterReason
from stream_export.errors import FormatError
from stream_export.gateway.metrics import GATEWAY_LABELS, GatewayMetrics
from stream_export.kafka import lag
from stream_export.ops import http, status
from stream_export.output import writer
from stream_export.output.writer import Writer
from stream_export.runtime.metrics import LABELS, Metrics
from tests.support.sinkfiles import sink_settings

PACKAGE = Path(stream_export.__file__).parent


def families(m: Metrics) -> dict[str, str]:
    text = generate_latest(m.registry).decode()
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def test_names_follow_prometheus_conventions() -> None:
    text = generate_latest(Metrics().registry).decode()
    assert "_total_total" not in text
    for name, kind in families(Metrics()).items():
        if name.startswith("process_"):
            continue  # the standard process metrics, prometheus-client's own names
        assert name.startswith("stream_export_"), name
        assert not name.endswith("_total"), f"{name}: the client library appends _total"
        if kind == "histogram":
            units = ("_seconds", "_steps", "_rollouts", "_reward_spread")
            assert name.endswith(units), f"{name}: base unit missing"
    assert "stream_export_consumer_lag_messages" in families(Metrics())


def test_the_reward_spread_stays_finite_whatever_the_rewards() -> None:
    m = Metrics()
    m.observe_reward_spread([0.25, 1.0, 0.5])
    for _ in range(3):  # max minus min overflows to inf; three caps still sum finitely
        m.observe_reward_spread([sys.float_info.max, 0.0, -sys.float_info.max])
    text = generate_latest(m.registry).decode()
    [family] = [f for f in text_string_to_metric_families(text) if f.name.endswith("_spread")]
    values = {s.name: s.value for s in family.samples if s.labels.get("le") in (None, "+Inf")}
    name = "stream_export_group_reward_spread"
    assert values == {f"{name}_bucket": 4, f"{name}_count": 4, f"{name}_sum": 0.75 + 3 * 1e12}
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    assert all(math.isfinite(s.value) for s in samples)


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
    everything = status.collect(m.registry)
    assert status.total(everything, "stream_export_events_consumed_total") == 7
    dead = status.by_label(everything, "stream_export_dead_letters_total", "reason")
    assert {reason: n for reason, n in dead.items() if n} == {"not_json": 1}
    shown = status.collect(m.registry, status.STATUS_FAMILIES)
    assert status.total(shown, "stream_export_events_consumed_total") == 7
    assert "stream_export_end_to_end_seconds_bucket" in everything
    assert "stream_export_end_to_end_seconds_bucket" not in shown


def test_throughput_is_a_rate_over_the_window() -> None:
    m = Metrics()
    t = status.Throughput(m.registry, window_s=10)
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
        {"upload_paused": 1},
    ):
        args = ready | change
        checks = http.readiness(**args)
        assert not all(checks.values()), change


def test_output_writable_needs_a_directory(tmp_path: Path) -> None:
    assert status.writable(str(tmp_path))
    assert status.writable(str(tmp_path / "not" / "yet" / "created"))
    afile = tmp_path / "a-file"
    afile.write_text("x")
    assert not status.writable(str(afile))
    assert not status.writable(str(afile / "below-a-file"))


def write(out: Path, lines: list[bytes], folder: str, **fields: Any) -> Writer:
    """``lines`` written by a real writer to partition folder ``folder`` (left open)."""
    settings = sink_settings(out, partition_by="domain", **fields)
    w = Writer.open(settings, worker_id="w", topic="t", metrics=Metrics())
    for i, line in enumerate(lines):
        w.append(f"{folder}{i}", [line], partition=0, offset=i, event_time=0.0, folder=folder)
    w.flush()
    return w


def test_recent_records_are_short_previews_of_the_newest_active_file(tmp_path: Path) -> None:
    assert status.recent_records(str(tmp_path), "training-data") == []
    lines = [f'{{"n": {i}, "text": "{"x" * 500}"}}'.encode() for i in range(20)]
    w = write(tmp_path, [b'{"old": 1}'], "old")
    os.utime(tmp_path / "domain=old" / "training-data.jsonl", (1, 1))
    w.close()
    w = write(tmp_path, lines, "math")
    with (tmp_path / "domain=math" / "training-data.jsonl").open("ab") as fh:
        fh.write(b'{"partial": ')  # past the checkpointed length: never shown
    got = status.recent_records(str(tmp_path), "training-data", n=3)
    w.close()
    assert [r["preview"][:8] for r in got] == ['{"n": 19', '{"n": 18', '{"n": 17']
    assert all(len(r["preview"]) == status.PREVIEW_CHARS for r in got)
    assert got[0]["bytes"] == len(lines[19]) + 1 and got[0]["file"] == "training-data.jsonl"


def test_recent_records_reads_only_the_tail_of_a_big_file(tmp_path: Path) -> None:
    line = b'{"k": "' + b"y" * 1000 + b'"}'
    write(tmp_path, [line] * 2000, "big").close()
    got = status.recent_records(str(tmp_path), "training-data", n=100)
    assert 0 < len(got) <= 64 and all(r["bytes"] == len(line) + 1 for r in got)


def test_process_metrics_are_on_the_registry() -> None:
    names = families(Metrics())
    for name in ("process_resident_memory_bytes", "process_cpu_seconds", "process_open_fds"):
        assert name in names, name


def test_labelled_counters_start_at_zero_for_every_known_label_value() -> None:
    m = Metrics()
    for name, series in LABELS.items():
        counter = getattr(m, name)
        labels = counter._labelnames  # noqa: SLF001 (the counter's own label names)
        for values in series:
            sample = f"stream_export_{name}_total"
            assert (
                m.registry.get_sample_value(sample, dict(zip(labels, values, strict=True))) == 0
            ), values
    text = generate_latest(m.registry).decode()
    assert 'stream_export_dead_letters_total{reason="not_json"} 0.0' in text
    gateway = GatewayMetrics()
    for name, series in GATEWAY_LABELS.items():
        counter = getattr(gateway, name)
        for values in series:
            sample, labels = f"stream_export_gateway_{name}_total", counter._labelnames  # noqa: SLF001
            found = gateway.registry.get_sample_value(
                sample, dict(zip(labels, values, strict=True))
            )
            assert found == 0, values


def _resolve(node: ast.expr, constants: dict[str, str]) -> list[str]:
    """The string values an expression can have, when they are literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in constants:
        return [constants[node.id]]
    if (
        isinstance(node, ast.Attribute)
        and _dotted(node) == f"{DeadLetterReason.__name__}.{node.attr}"
    ):
        return [DeadLetterReason[node.attr].value]
    if isinstance(node, ast.IfExp):
        return _resolve(node.body, constants) + _resolve(node.orelse, constants)
    return []


def _dotted(node: ast.expr) -> str:
    return (
        f"{_dotted(node.value)}.{node.attr}"
        if isinstance(node, ast.Attribute)
        else getattr(node, "id", "")
    )


def _name(path: Path) -> str:
    """A module's path below the package without ``.py``: what ``_module`` takes."""
    return path.relative_to(PACKAGE).with_suffix("").as_posix()


def _module(name: str) -> tuple[ast.Module, dict[str, str]]:
    tree = ast.parse((PACKAGE / f"{name}.py").read_text())
    constants = {
        t.id: values[0]
        for n in tree.body
        if isinstance(n, ast.Assign | ast.AnnAssign) and n.value is not None
        for values in [_resolve(n.value, {})]
        if len(values) == 1
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Name)
    }
    return tree, constants


def _calls(module: str, name: str) -> Iterator[tuple[ast.Call, dict[str, str]]]:
    tree, constants = _module(module)
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called == name:
                yield node, constants


def _literals(module: str, function: str, argument: int | str) -> set[str]:
    """The literal values of one argument (by position or keyword) of every call to
    ``function`` in ``module``."""
    found: set[str] = set()
    for call, constants in _calls(module, function):
        for node in _arguments(call, argument):
            found.update(_resolve(node, constants))
    return found


def _arguments(call: ast.Call, argument: int | str) -> list[ast.expr]:
    """One argument of a call, by position or keyword ([] when not given)."""
    if isinstance(argument, int):
        return call.args[argument : argument + 1]
    return [kw.value for kw in call.keywords if kw.arg == argument]


def known(name: str) -> set[str]:
    return {values[0] for values in LABELS[name]}


def test_the_code_uses_no_label_value_missing_from_the_vocabulary() -> None:
    """Literal label values and reasons in the code are all in metrics.LABELS, so every
    series the code can increment exists at 0 from the start."""
    for path in PACKAGE.rglob("*.py"):
        for call, constants in _calls(_name(path), "labels"):
            assert isinstance(call.func, ast.Attribute)
            family = call.func.value
            values = [_resolve(a, constants) for a in call.args]
            if isinstance(family, ast.Attribute) and all(len(v) == 1 for v in values):
                got = tuple(v[0] for v in values)
                vocabulary = {**LABELS, **GATEWAY_LABELS}[family.attr]
                assert got in vocabulary, f"{_name(path)}: {family.attr}{got}"
    decode = _literals("contract/decoding", "DecodeError", "reason")
    assert decode and decode <= known("events_invalid") & known("dead_letters")
    over_limit = _literals("assemble/state", "_over_limit", 1)
    rejected = _literals("assemble/state", "Rejected", 0) | over_limit
    rejected |= _literals("assemble/agent", "Rejected", 0)
    own_counter = {"late_event", "conflicting_duplicate"}
    assert rejected - own_counter <= known("events_invalid"), rejected - known("events_invalid")
    assert rejected <= known("dead_letters")
    episode_errors = _literals("assemble/publish", "EpisodeError", "reason")
    assert episode_errors and episode_errors | {FormatError.reason} <= known("dead_letters")
    truncated = _literals("assemble/state", "_close", 1) | over_limit
    assert truncated <= known("episodes_truncated"), truncated - known("episodes_truncated")
    assert set(typing.get_args(writer.Reason)) == known("files_rotated")
    assert set(typing.get_args(events.Outcome)) == known("episodes_emitted")
    assert set(_returns("output/writer", "_error_kind")) <= known("sink_errors")
    filters = _returns("output/filters", None)
    assert filters and set(filters) <= known("episodes_filtered")


#: Calls that carry a dead-letter reason, and which argument it is.
DEAD_LETTER_CALLS: dict[str, int | str] = {
    "DecodeError": "reason",
    "EpisodeError": "reason",
    "FormatError": "reason",
    "Rejected": 0,
    "_over_limit": 1,
}


def test_dead_letter_reasons_are_named_constants() -> None:
    """Every literal reason given to a dead-letter error or rejection is a
    DeadLetterReason member (directly or through a module constant), never a bare
    string."""
    for path in PACKAGE.rglob("*.py"):
        for function, argument in DEAD_LETTER_CALLS.items():
            for call, constants in _calls(_name(path), function):
                for node in _arguments(call, argument):
                    where = f"{_name(path)}: {ast.unparse(call)}"
                    assert not isinstance(node, ast.Constant), where
                    if isinstance(node, ast.Name) and node.id in constants:
                        assert constants[node.id] in set(DeadLetterReason), where


def _returns(module: str, function: str | None) -> list[str]:
    """String literals returned by ``function`` (or any function or lambda) of a module."""
    tree, constants = _module(module)
    scopes = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef | ast.Lambda)
        and (function is None or getattr(n, "name", None) == function)
    ]
    found: list[str] = []
    for scope in scopes:
        if isinstance(scope, ast.Lambda):
            found += _resolve(scope.body, constants)
            continue
        for node in ast.walk(scope):
            if isinstance(node, ast.Return) and node.value is not None:
                found += _resolve(node.value, constants)
    return found
