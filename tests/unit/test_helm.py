"""helm lint and helm template with every ci/ values file; the rendered manifests
are checked for probes, security context, volumes per pod and setting names."""

from __future__ import annotations

import functools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_export import config
from tests import helm_schema
from tests.monitoring import CHART, dashboard, rules, tool

VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
Manifests = dict[str, list[dict[str, Any]]]


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("helm"), *args], capture_output=True, text=True, timeout=120, cwd=CHART
    )


@functools.cache
def render(values: Path | None, *sets: str) -> Manifests:
    args = ["template", "rel", ".", "--namespace", "ns"]
    if values is not None:
        args += ["-f", str(values)]
    for s in sets:
        args += ["--set", s]
    done = helm(*args)
    assert done.returncode == 0, done.stderr
    by_kind: Manifests = {}
    for doc in yaml.safe_load_all(done.stdout):
        if doc:
            by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def worker(manifests: Manifests) -> tuple[dict[str, Any], dict[str, Any]]:
    (sts,) = manifests["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def env(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container["env"]}


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_lint_is_clean(values: Path) -> None:
    done = helm("lint", "--strict", ".", "-f", str(values))
    assert done.returncode == 0, done.stdout + done.stderr


def test_schema_rejects_bad_values() -> None:
    for bad in (
        "replicaCount=0",
        "kafka.securityProtocol=SASL",
        "nope=1",
        "settings.nosection.x=1",
    ):
        done = helm("template", "rel", ".", "--set", bad)
        assert done.returncode != 0, bad
        assert "schema" in done.stderr, done.stderr


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_every_environment_variable_is_a_setting_the_worker_reads(values: Path) -> None:
    _, container = worker(render(values))
    names = [n for n in env(container) if n.startswith(config.ENV_PREFIX)]
    assert names and len(names) == len(set(names))
    unknown = set(names) - set(config.env_names())
    assert not unknown, f"{values.name}: not settings: {sorted(unknown)}"


def test_the_settings_schema_is_generated_from_the_code() -> None:
    assert json.loads(helm_schema.SCHEMA.read_text()) == helm_schema.generated(), (
        "values.schema.json is stale: run python -m tests.helm_schema"
    )


def test_every_setting_is_a_settings_key_or_set_by_the_chart() -> None:
    allowed = {
        f"{section}.{field}"
        for section, node in helm_schema.settings_schema()["properties"].items()
        for field in node["properties"]
    }
    for key in config.field_types():
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
    ],
)
def test_a_misspelled_or_out_of_range_setting_fails_the_render(bad: str, named: str) -> None:
    done = helm("template", "rel", ".", "--set", bad)
    assert done.returncode != 0 and "schema" in done.stderr, done.stderr
    assert named in done.stderr, done.stderr


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_the_rendered_environment_loads(values: Path) -> None:
    _, container = worker(render(values))
    wanted = {k: v for k, v in env(container).items() if k.startswith(config.ENV_PREFIX)}
    config.load(env={k: v for k, v in wanted.items() if v is not None})


def test_values_within_the_bounds_render_and_load() -> None:
    sets = ("settings.sink.rotate_bytes=0", "settings.sink.flush_interval_ms=60000")
    _, container = worker(render(None, *sets, "settings.format.min_reward=-0.5"))
    e = {k: v for k, v in env(container).items() if v is not None}
    s = config.load(env={k: v for k, v in e.items() if k.startswith(config.ENV_PREFIX)})
    assert (s.sink.rotate_bytes, s.sink.flush_interval_ms, s.format.min_reward) == (0, 60000, -0.5)


def test_settings_pass_through_as_strings_the_worker_parses() -> None:
    _, container = worker(render(CHART / "ci" / "settings-values.yaml"))
    e = env(container)
    wanted = {k: v for k, v in e.items() if k.startswith(config.ENV_PREFIX) and v is not None}
    s = config.load(env=wanted)
    assert s.sink.rotate_bytes == 134217728 and s.sink.compression == "gzip"
    assert s.format.domains == ["math", "text-adventure"]
    assert s.topics.partitions == 8 and s.worker.log_level == "debug"
    assert (s.sink.output_dir, s.worker.data_dir, s.http.host) == ("/data", "/state", "0.0.0.0")


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_probes_security_context_and_resources(values: Path) -> None:
    m = render(values)
    pod, c = worker(m)
    port = {p["name"]: p["containerPort"] for p in c["ports"]}["http"]
    assert env(c)["STREAM_EXPORT_HTTP_PORT"] == str(port)
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    if values.stem != "settings-values":
        assert c["startupProbe"]["httpGet"]["path"] == "/healthz"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert pod["automountServiceAccountToken"] is False


def test_probes_can_be_turned_off_one_by_one() -> None:
    _, c = worker(render(CHART / "ci" / "settings-values.yaml"))
    assert "startupProbe" not in c and "readinessProbe" in c


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_a_volume_per_pod_for_table_store_and_output(values: Path) -> None:
    m = render(values)
    (sts,) = m["StatefulSet"]
    pod, c = worker(m)
    claims = {t["metadata"]["name"]: t for t in sts["spec"]["volumeClaimTemplates"]}
    assert set(claims) == {"state", "data"}
    mounts = {v["name"]: v["mountPath"] for v in c["volumeMounts"]}
    e = env(c)
    assert mounts["state"] == e["STREAM_EXPORT_WORKER_DATA_DIR"]
    assert mounts["data"] == e["STREAM_EXPORT_SINK_OUTPUT_DIR"]
    assert mounts["tmp"] == "/tmp"
    # every writable path is a volume: the root file system is read-only
    assert {v["name"] for v in pod["volumes"]} | set(claims) >= set(mounts)
    assert sts["spec"]["serviceName"] in {s["metadata"]["name"] for s in m["Service"]}


def test_storage_classes_and_sizes_come_from_values() -> None:
    (sts,) = render(CHART / "ci" / "settings-values.yaml")["StatefulSet"]
    claims = {t["metadata"]["name"]: t["spec"] for t in sts["spec"]["volumeClaimTemplates"]}
    assert claims["data"]["storageClassName"] == "standard"
    assert claims["data"]["resources"]["requests"]["storage"] == "200Gi"
    assert claims["state"]["storageClassName"] == "fast-ssd"


def test_services_and_pdb_select_the_worker_pods() -> None:
    m = render(None)
    (sts,) = m["StatefulSet"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    selectors = [s["spec"]["selector"] for s in m["Service"]]
    selectors.append(m["PodDisruptionBudget"][0]["spec"]["selector"]["matchLabels"])
    for selector in selectors:
        assert selector.items() <= labels.items()
    assert "PodDisruptionBudget" not in render(CHART / "ci" / "settings-values.yaml")


def test_sasl_password_comes_from_a_mounted_secret_never_a_value() -> None:
    m = render(CHART / "ci" / "sasl-values.yaml")
    pod, c = worker(m)
    e = env(c)
    assert "STREAM_EXPORT_KAFKA_SASL_PASSWORD" not in e
    assert e["STREAM_EXPORT_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL"
    assert e["STREAM_EXPORT_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["kafka-sasl"]["secret"]["secretName"] == "stream-export-kafka"
    assert volumes["kafka-tls"]["secret"]["secretName"] == "kafka-ca"
    mounts = {v["name"]: v for v in c["volumeMounts"]}
    password_file = e["STREAM_EXPORT_KAFKA_SASL_PASSWORD_FILE"]
    assert password_file is not None
    assert password_file.startswith(mounts["kafka-sasl"]["mountPath"] + "/")
    assert mounts["kafka-sasl"]["readOnly"] is True
    cafile = e["STREAM_EXPORT_KAFKA_SSL_CAFILE"]
    assert cafile is not None and cafile.startswith(mounts["kafka-tls"]["mountPath"] + "/")
    assert "Secret" not in m  # the chart references secrets, it never creates them


def test_client_certificate_for_mutual_tls() -> None:
    _, c = worker(render(CHART / "ci" / "mtls-values.yaml"))
    e = env(c)
    assert e["STREAM_EXPORT_KAFKA_SECURITY_PROTOCOL"] == "SSL"
    assert str(e["STREAM_EXPORT_KAFKA_SSL_CERTFILE"]).endswith("/tls.crt")
    assert str(e["STREAM_EXPORT_KAFKA_SSL_KEYFILE"]).endswith("/tls.key")
    assert "STREAM_EXPORT_KAFKA_SASL_MECHANISM" not in e


def test_monitoring_resources_ship_the_tested_rules_and_dashboard() -> None:
    m = render(CHART / "ci" / "monitoring-values.yaml")
    (rule,) = m["PrometheusRule"]
    assert rule["spec"]["groups"] == rules()["groups"]
    (monitor,) = m["ServiceMonitor"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    assert {"action": "replace", "targetLabel": "job", "replacement": "stream-export"} in endpoint[
        "relabelings"
    ]
    (cm,) = [c for c in m["ConfigMap"] if c["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["stream-export.json"]) == dashboard()


def test_monitoring_resources_are_off_by_default() -> None:
    m = render(None)
    assert not {"PrometheusRule", "ServiceMonitor", "ConfigMap"} & set(m)
