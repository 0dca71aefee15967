"""helm lint and helm template with every ci/ values file; the rendered manifests
are decoded strictly into the Kubernetes API types (dev/validate, offline) and
checked for probes, security context, volumes per pod, labels, selectors and
setting names. No cluster here: `helm install` and `helm test` themselves are
not run; the test pod is rendered and validated like the rest."""

from __future__ import annotations

import functools
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_export import config, setting_values
from tests import helm_schema, validate
from tests.monitoring import CHART, dashboard, rules, tool, versions

VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
Manifests = dict[str, list[dict[str, Any]]]
#: helm template's own default (1.20) is below the chart's kubeVersion.
KUBE_VERSION = "1.33.0"
RECOMMENDED_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
}


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("helm"), *args], capture_output=True, text=True, timeout=120, cwd=CHART
    )


def template(*args: str) -> subprocess.CompletedProcess[str]:
    return helm("template", "rel", ".", "--namespace", "ns", "--kube-version", KUBE_VERSION, *args)


@functools.cache
def rendered(values: Path | None, *sets: str) -> str:
    args = [] if values is None else ["-f", str(values)]
    for s in sets:
        args += ["--set", s]
    done = template(*args)
    assert done.returncode == 0, done.stderr
    return done.stdout


@functools.cache
def render(values: Path | None, *sets: str) -> Manifests:
    by_kind: Manifests = {}
    for doc in yaml.safe_load_all(rendered(values, *sets)):
        if doc:
            by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


def worker(manifests: Manifests) -> tuple[dict[str, Any], dict[str, Any]]:
    (sts,) = manifests["StatefulSet"]
    pod = sts["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == "worker"]
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
        done = template("--set", bad)
        assert done.returncode != 0, bad
        assert "schema" in done.stderr, done.stderr


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_every_environment_variable_is_a_setting_the_worker_reads(values: Path) -> None:
    _, container = worker(render(values))
    names = [n for n in env(container) if n.startswith(setting_values.ENV_PREFIX)]
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
    done = template("--set", bad)
    assert done.returncode != 0 and "schema" in done.stderr, done.stderr
    assert named in done.stderr, done.stderr


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_the_rendered_environment_loads(values: Path) -> None:
    _, container = worker(render(values))
    wanted = {k: v for k, v in env(container).items() if k.startswith(setting_values.ENV_PREFIX)}
    config.load(env={k: v for k, v in wanted.items() if v is not None})


def test_values_within_the_bounds_render_and_load() -> None:
    sets = ("settings.sink.rotate_bytes=0", "settings.sink.flush_interval_ms=60000")
    _, container = worker(render(None, *sets, "settings.format.min_reward=-0.5"))
    e = {k: v for k, v in env(container).items() if v is not None}
    s = config.load(env={k: v for k, v in e.items() if k.startswith(setting_values.ENV_PREFIX)})
    assert (s.sink.rotate_bytes, s.sink.flush_interval_ms, s.format.min_reward) == (0, 60000, -0.5)


def test_settings_pass_through_as_strings_the_worker_parses() -> None:
    _, container = worker(render(CHART / "ci" / "settings-values.yaml"))
    e = env(container)
    wanted = {
        k: v for k, v in e.items() if k.startswith(setting_values.ENV_PREFIX) and v is not None
    }
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


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_manifests_decode_strictly_into_the_api_types(values: Path) -> None:
    kinds = validate.kubernetes(rendered(values))
    assert len(kinds) == sum(len(docs) for docs in render(values).values())
    assert {"StatefulSet/rel-stream-export", "Pod/rel-stream-export-test-http"} <= set(kinds)


def test_the_strict_check_rejects_what_the_api_server_would() -> None:
    text = rendered(None)
    for wrong, right, named in (
        ("podManagmentPolicy: Parallel", "podManagementPolicy: Parallel", "unknown field"),
        ("replicas: two", "replicas: 2", "replicas"),
        ("kind: StatefulSett", "kind: StatefulSet", "no kind"),
        ("name: Rel_X\n", "name: rel-stream-export\n", "RFC 1123"),
    ):
        assert right in text, right
        done = validate.run("k8s", stdin=text.replace(right, wrong, 1))
        assert done.returncode != 0 and named in done.stderr, (wrong, done.stderr)


def test_the_service_monitor_scrapes_each_pod_once() -> None:
    m = render(CHART / "ci" / "monitoring-values.yaml")
    (monitor,) = m["ServiceMonitor"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [s for s in m["Service"] if selector.items() <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in selected] == ["rel-stream-export"]
    assert "clusterIP" not in selected[0]["spec"]  # not the headless one


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        (
            ["replicaCount=5"],
            "replicaCount 5 is above topics.partitions 4: each pod needs a partition",
        ),
        (
            ["replicaCount=9", "topics.partitions=8"],
            "replicaCount 9 is above topics.partitions 8",
        ),
        (
            ["kafka.securityProtocol=SASL_SSL"],
            "kafka.securityProtocol SASL_SSL needs kafka.sasl.mechanism: PLAIN, SCRAM-SHA-256",
        ),
        (
            ["kafka.securityProtocol=SASL_PLAINTEXT"],
            "kafka.securityProtocol SASL_PLAINTEXT needs kafka.sasl.mechanism",
        ),
    ],
)
def test_values_that_cannot_work_fail_the_render(sets: list[str], message: str) -> None:
    done = template(*(arg for s in sets for arg in ("--set", s)))
    assert done.returncode != 0 and message in done.stderr, done.stderr


def test_as_many_replicas_as_partitions_render() -> None:
    (sts,) = render(None, "replicaCount=4")["StatefulSet"]
    assert sts["spec"]["replicas"] == 4


def test_pods_carry_the_recommended_labels() -> None:
    m = render(None)
    (sts,) = m["StatefulSet"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert set(labels) >= RECOMMENDED_LABELS
    assert labels["app.kubernetes.io/version"] == "0.1.0"
    assert labels["app.kubernetes.io/component"] == "worker"
    for kind, docs in m.items():
        for doc in docs:
            assert set(doc["metadata"]["labels"]) >= RECOMMENDED_LABELS, kind


def test_chart_metadata() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for key in ("home", "icon"):
        assert chart[key].startswith("https://"), key
    assert chart["sources"] and all(s.startswith("https://") for s in chart["sources"])
    assert chart["kubeVersion"] == ">=1.27.0-0"  # persistentVolumeClaimRetentionPolicy
    done = helm("template", "rel", ".", "--kube-version", "1.26.0")
    assert done.returncode != 0 and "kubeVersion" in done.stderr


def test_network_policy_admits_the_namespace_and_the_configured_peers() -> None:
    m = render(None)
    (sts,) = m["StatefulSet"]
    (policy,) = m["NetworkPolicy"]
    spec = policy["spec"]
    assert (
        spec["podSelector"]["matchLabels"].items()
        <= sts["spec"]["template"]["metadata"]["labels"].items()
    )
    assert spec["policyTypes"] == ["Ingress"]
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert rule["from"] == [{"podSelector": {}}]
    (extra,) = render(CHART / "ci" / "extras-values.yaml")["NetworkPolicy"]
    peers = extra["spec"]["ingress"][0]["from"]
    assert peers[0] == {"podSelector": {}} and "namespaceSelector" in peers[1]
    assert "NetworkPolicy" not in render(None, "networkPolicy.enabled=false")


def test_extra_volumes_containers_and_pod_policies() -> None:
    m = render(CHART / "ci" / "extras-values.yaml")
    (sts,) = m["StatefulSet"]
    spec = sts["spec"]
    pod, worker_container = worker(m)
    assert [c["name"] for c in pod["containers"]] == ["worker", "ship"]
    assert [c["name"] for c in pod["initContainers"]] == ["wait-for-kafka"]
    assert "s3-credentials" in {v["name"] for v in pod["volumes"]}
    assert "/var/run/secrets/s3" in {v["mountPath"] for v in worker_container["volumeMounts"]}
    ship = pod["containers"][1]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in ship["volumeMounts"]
    assert pod["priorityClassName"] == "batch-high"
    assert spec["updateStrategy"] == {"type": "OnDelete"}
    assert spec["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Delete",
        "whenScaled": "Retain",
    }
    (default,) = render(None)["StatefulSet"]
    assert default["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
    assert default["spec"]["persistentVolumeClaimRetentionPolicy"] == {
        "whenDeleted": "Retain",
        "whenScaled": "Retain",
    }
    assert "priorityClassName" not in default["spec"]["template"]["spec"]


def test_the_helm_test_pod_checks_the_service_with_the_chart_image() -> None:
    m = render(None)
    (test_pod,) = [p for p in m["Pod"] if p["metadata"]["annotations"]["helm.sh/hook"] == "test"]
    _, worker_container = worker(m)
    (container,) = test_pod["spec"]["containers"]
    assert container["image"] == worker_container["image"] == "stream-export:0.1.0"
    (service,) = [s for s in m["Service"] if "clusterIP" not in s["spec"]]
    url = f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    script = container["args"][0]
    assert f"{url}/readyz" in script and f"{url}/metrics" in script
    compile(script, "helm-test", "exec")  # the script itself is valid Python
    assert test_pod["spec"]["securityContext"]["runAsNonRoot"] is True
    # No selector of the release picks the test pod up.
    labels = test_pod["metadata"]["labels"]
    selectors = [s["spec"]["selector"] for s in m["Service"]]
    selectors += [m["PodDisruptionBudget"][0]["spec"]["selector"]["matchLabels"]]
    selectors += [m["NetworkPolicy"][0]["spec"]["podSelector"]["matchLabels"]]
    assert not [sel for sel in selectors if sel.items() <= labels.items()]
    assert "Pod" not in render(None, "tests.enabled=false")


def notes(tmp_path: Path, *sets: str) -> str:
    """NOTES.txt as `helm install` prints it: helm renders NOTES only against a
    cluster, so a copy of the chart renders it with ``tpl`` into a ConfigMap."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)  # symbolic links become the files they point to
    shutil.copy(chart / "templates" / "NOTES.txt", chart / "files" / "NOTES.txt")
    (chart / "templates" / "zz-notes.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes}\n"
        'data: {notes: {{ tpl (.Files.Get "files/NOTES.txt") . | quote }}}\n'
    )
    args = ["template", "rel", str(chart), "--kube-version", KUBE_VERSION]
    args += ["--show-only", "templates/zz-notes.yaml"]
    done = helm(*args, *(arg for s in sets for arg in ("--set", s)))
    assert done.returncode == 0, done.stderr
    text: str = yaml.safe_load(done.stdout)["data"]["notes"]
    return text


def test_notes_say_how_to_build_and_push_the_image(tmp_path: Path) -> None:
    default = notes(tmp_path / "default")
    assert 'WARNING: image.repository is "stream-export", which no registry serves' in default
    assert "docker build -t REGISTRY/stream-export:0.1.0 ." in default
    assert "docker push REGISTRY/stream-export:0.1.0" in default
    assert "--set image.repository=REGISTRY/stream-export" in default
    assert "helm test rel -n default" in default
    assert "NetworkPolicy" not in default
    pushed = notes(
        tmp_path / "pushed",
        "image.repository=registry.example.com/ml/stream-export",
        "serviceMonitor.enabled=true",
    )
    assert "WARNING" not in pushed
    assert "Image: registry.example.com/ml/stream-export:0.1.0" in pushed
    assert "add it to networkPolicy.extraIngressFrom" in pushed


def test_the_chart_readme_says_how_to_build_and_push_the_image() -> None:
    readme = (CHART / "README.md").read_text()
    assert "docker build -t registry.example.com/ml/stream-export:0.1.0 ." in readme
    assert "docker push registry.example.com/ml/stream-export:0.1.0" in readme
    assert "--set image.repository=registry.example.com/ml/stream-export" in readme


def test_the_chart_readme_is_generated_from_the_values() -> None:
    helm_docs = (
        CHART.parents[1]
        / "dev"
        / ".cache"
        / f"helm-docs-{versions()['HELM_DOCS_VERSION']}"
        / "bin"
        / "helm-docs"
    )
    assert helm_docs.exists(), "helm-docs is missing: run dev/setup --dev"
    done = subprocess.run(
        [str(helm_docs), "--dry-run", "-c", "helm", "-s", "file", "--log-level", "error"],
        cwd=CHART.parents[1],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == (CHART / "README.md").read_text(), (
        "helm/stream-export/README.md is stale: run dev/.cache/helm-docs-*/bin/helm-docs "
        "-c helm -s file"
    )
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for key in ("networkPolicy", "extraVolumes", "updateStrategy", "priorityClassName", "tests"):
        assert key in values and f"| {key}" in done.stdout, key


def test_the_readme_install_command_renders_and_validates() -> None:
    readme = (CHART.parents[1] / "README.md").read_text()
    section = readme.split("### Helm\n", 1)[1]
    command = section.split("```sh\n", 1)[1].split("```", 1)[0]
    (install,) = [c for c in command.replace("\\\n", " ").splitlines() if "helm install" in c]
    sets = [s.strip("'") for s in re.findall(r"--set ('[^']+'|\S+)", install)]
    manifests = rendered(None, *sets)
    assert "ServiceMonitor/rel-stream-export" in validate.kubernetes(manifests)
    (policy,) = render(None, *sets)["NetworkPolicy"]
    peers = policy["spec"]["ingress"][0]["from"]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    } in peers
