"""Alert rules and dashboard: promtool checks and unit tests, and PromQL that names
only metrics the worker declares (tests/integration/ops/test_ops.py repeats the name
check against a live worker under load)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import yaml
from prometheus_client import generate_latest

from stream_export.gateway.metrics import GatewayMetrics
from stream_export.ops.status import GROUP_FAMILIES
from stream_export.runtime.metrics import Metrics
from tests.support.monitoring import (
    CHART,
    DASHBOARD,
    GATEWAY_PREFIX,
    PROMETHEUS_YML,
    RULE_TESTS,
    RULES,
    dashboard,
    exposed_names,
    promql_expressions,
    referenced_names,
    rules,
    tool,
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("promtool"), *args], capture_output=True, text=True, timeout=60, cwd=RULES.parent
    )


def test_promtool_checks_the_rules() -> None:
    done = promtool("check", "rules", str(RULES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in rules()['groups'])} rules" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = promtool("test", "rules", str(RULE_TESTS))
    assert done.returncode == 0, done.stdout + done.stderr


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    (tmp_path / "rules.yml").write_text(RULES.read_text().replace("> 600", "> 6000"))
    (tmp_path / "t.yml").write_text(RULE_TESTS.read_text())
    done = promtool("test", "rules", str(tmp_path / "t.yml"))
    assert done.returncode != 0 and "StreamExportNoWrites" in done.stdout + done.stderr


def test_every_alert_has_a_unit_test_that_expects_it_to_fire() -> None:
    tested = {
        case["alertname"]
        for group in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in group["alert_rule_test"]
        if case["exp_alerts"]
    }
    alerts = {r["alert"] for g in rules()["groups"] for r in g["rules"]}
    assert alerts == tested


def test_prometheus_config_is_valid() -> None:
    done = promtool("check", "config", str(PROMETHEUS_YML))
    assert done.returncode == 0, done.stdout + done.stderr


def test_alerts_carry_severity_and_text() -> None:
    for group in rules()["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in {"warning", "critical"}, rule["alert"]
            assert rule["annotations"]["summary"] and rule["annotations"]["description"]


def test_promql_names_only_metrics_the_worker_declares() -> None:
    declared = exposed_names(generate_latest(Metrics().registry).decode())
    referenced = referenced_names()
    assert referenced, "no stream_export_ metric referenced at all"
    assert referenced <= declared, f"not exposed: {sorted(referenced - declared)}"


def test_promql_names_only_metrics_the_gateway_declares() -> None:
    """The gateway panels query the gateway's own registry (its own process and port)."""
    declared = exposed_names(generate_latest(GatewayMetrics().registry).decode())
    referenced = referenced_names(gateway=True)
    assert len(referenced) >= 5, referenced  # calls, tokens, unrecorded, times, episodes
    assert referenced <= declared, f"not exposed: {sorted(referenced - declared)}"


def test_every_expression_parses(tmp_path: Path) -> None:
    """promtool parses each expression (as a recording rule), so dashboards hold no typos."""
    grafana = {"$__rate_interval": "1m", "$pod": ".*", "$gateway": ".*"}
    records = []
    for i, expr in enumerate(promql_expressions()):
        for var, value in grafana.items():
            expr = expr.replace(var, value)
        if expr.startswith("label_values("):
            expr = expr.removeprefix("label_values(").split(",")[0]
        records.append({"record": f"expr_{i}", "expr": expr})
    rule_file = tmp_path / "exprs.yml"
    rule_file.write_text(yaml.safe_dump({"groups": [{"name": "all", "rules": records}]}))
    done = promtool("check", "rules", str(rule_file))
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_covers_the_operators_questions() -> None:
    d = dashboard()
    assert d["uid"] == "stream-export"
    titles = " ".join(p["title"].lower() for p in d["panels"])
    for topic in ("throughput", "lag", "latency", "open episodes", "errors", "disk", "gateway"):
        assert topic in titles, topic
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    for panel in d["panels"]:
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            for target in panel["targets"]:  # the gateway's panels select gateway pods
                gateway = (
                    "stream-export-gateway" in target["expr"] or GATEWAY_PREFIX in target["expr"]
                )
                assert ('pod=~"$gateway"' if gateway else 'pod=~"$pod"') in target["expr"]


def test_workers_are_told_apart_by_pod_not_instance() -> None:
    """instance (the pod's address) changes on every restart; the pod name does not."""
    variables = {v["name"]: v for v in dashboard()["templating"]["list"] if v["type"] == "query"}
    assert set(variables) == {"pod", "gateway"}
    assert variables["pod"]["definition"] == "label_values(stream_export_build_info, pod)"
    assert (
        variables["gateway"]["definition"] == "label_values(stream_export_gateway_build_info, pod)"
    )
    exprs = promql_expressions()
    assert not [e for e in exprs if "instance" in e]
    assert "$labels.instance" not in RULES.read_text()
    # docker compose has no pods: its Prometheus gives the one worker a pod label
    for job in yaml.safe_load(PROMETHEUS_YML.read_text())["scrape_configs"]:
        assert job["static_configs"][0]["labels"]["pod"], job["job_name"]


def test_no_panel_counts_a_bad_message_twice() -> None:
    """Every invalid event is also a dead letter: no panel plots both counters."""
    for panel in dashboard()["panels"]:
        exprs = " ".join(t["expr"] for t in panel.get("targets", []))
        assert not (
            "stream_export_events_invalid" in exprs and "stream_export_dead_letters" in exprs
        ), panel["title"]
        for twice in ("stream_export_steps_conflicting", "stream_export_events_late"):
            assert not (twice in exprs and "stream_export_dead_letters" in exprs), panel["title"]
    assert any("stream_export_dead_letters_total" in e for e in promql_expressions())


def test_dashboard_shows_sink_lag_and_process_resources() -> None:
    exprs = promql_expressions()
    lag = [p for p in dashboard()["panels"] if "consumer_lag" in json.dumps(p.get("targets", []))]
    assert any("sink" in p["title"] for p in lag)
    for name in ("process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds"):
        assert any(name in e for e in exprs), name


def test_dashboard_charts_every_family_of_the_groups_stage() -> None:
    """The families the status page's groups panel reads, each by pod on the dashboard."""
    groups = [p for p in dashboard()["panels"] if "group" in p["title"].lower()]
    exprs = " ".join(t["expr"] for p in groups for t in p.get("targets", []))
    kinds = ("", "_total", "_bucket", "_sum")  # a gauge, counter, histogram, summary
    for family in GROUP_FAMILIES:
        assert any(f"{family}{kind}{{" in exprs for kind in kinds), family
    assert "sum by (pod) (stream_export_groups_open" in exprs


def test_the_chart_ships_the_same_rules_and_dashboard() -> None:
    assert (CHART / "files" / "rules.yml").resolve() == RULES.resolve()
    assert (CHART / "files" / "dashboard.json").resolve() == DASHBOARD.resolve()
