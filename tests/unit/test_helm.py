"""helm lint and helm template with every ci/ values file; the rendered manifests
are decoded strictly into the Kubernetes API types (dev/validate, offline) and
checked for probes, security context, volumes per pod, labels and selectors
(the settings the chart passes: test_helm_settings.py). No cluster here: `helm
install` and `helm test` themselves are not run; the test pod is rendered and
validated like the rest."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.support import validate
from tests.support.helm_chart import (
    KUBE_VERSION,
    VALUES,
    env,
    helm,
    render,
    rendered,
    statefulset,
    template,
    worker,
)
from tests.support.monitoring import CHART, dashboard, rules, versions

RECOMMENDED_LABELS = {
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
}


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_lint_is_clean(values: Path) -> None:
    done = helm("lint", "--strict", ".", "-f", str(values))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_probes_security_context_and_resources(values: Path) -> None:
    m = render(values)
    pod, c = worker(m)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert env(c)["STREAM_EXPORT_HTTP_PORT"] == str(ports["http"])
    assert env(c)["STREAM_EXPORT_HTTP_PROBE_PORT"] == str(ports["probe"])
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probe"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probe"}
    if values.stem != "settings-values":
        assert c["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "probe"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert c["resources"]["requests"] and c["resources"]["limits"]["memory"]
    assert pod["automountServiceAccountToken"] is False


def test_only_the_kubelet_reaches_the_probe_port() -> None:
    """No Service exposes it and the NetworkPolicy admits no pod to it: kubelet
    probes come from the node, which a NetworkPolicy always admits."""
    m = render(None)
    for service in m["Service"]:
        assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]
    (policy,) = m["NetworkPolicy"]
    assert [port["port"] for port in policy["spec"]["ingress"][0]["ports"]] == ["http"]


def test_without_a_probe_port_the_probes_use_the_http_port() -> None:
    _, c = worker(render(None, "http.probePort="))
    assert [p["name"] for p in c["ports"]] == ["http"]
    assert "STREAM_EXPORT_HTTP_PROBE_PORT" not in env(c)
    for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["port"] == "http", probe


def test_probes_can_be_turned_off_one_by_one() -> None:
    _, c = worker(render(CHART / "ci" / "settings-values.yaml"))
    assert "startupProbe" not in c and "readinessProbe" in c


@pytest.mark.parametrize("values", VALUES, ids=lambda p: p.stem)
def test_a_volume_per_pod_for_table_store_and_output(values: Path) -> None:
    m = render(values)
    sts = statefulset(m)
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
            ["http.probePort=9108"],
            "http.probePort 9108 is http.port: give the probes a port of their own",
        ),
        (
            ["http.port=9200", "http.probePort=9200"],
            "http.probePort 9200 is http.port",
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


def test_the_docs_install_command_renders_and_validates() -> None:
    page = (CHART.parents[1] / "docs" / "operations" / "helm.md").read_text()
    command = page.split("```sh\n", 1)[1].split("```", 1)[0]
    (install,) = [c for c in command.replace("\\\n", " ").splitlines() if "helm install" in c]
    sets = [s.strip("'") for s in re.findall(r"--set ('[^']+'|\S+)", install)]
    manifests = rendered(None, *sets)
    assert "ServiceMonitor/rel-stream-export" in validate.kubernetes(manifests)
    (policy,) = render(None, *sets)["NetworkPolicy"]
    peers = policy["spec"]["ingress"][0]["from"]
    assert {
        "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    } in peers


def test_the_fleet_example_uploads_parquet_and_its_trainer_job_is_valid() -> None:
    """docs/operations/fleet.md: workers that upload Parquet to one bucket with
    credentials from a Secret, and a trainer Job that reads the bucket."""
    m = render(CHART / "ci" / "fleet-values.yaml")
    _, c = worker(m)
    e = env(c)
    assert e["STREAM_EXPORT_SINK_ENCODING"] == "parquet"
    assert e["STREAM_EXPORT_SINK_UPLOAD_URL"] == "s3://training-data/fleet-1"
    secrets = {
        v["name"]: v["valueFrom"]["secretKeyRef"]["name"] for v in c["env"] if "valueFrom" in v
    }
    assert secrets["AWS_SECRET_ACCESS_KEY"] == "training-data-bucket"
    job = (CHART.parents[1] / "examples" / "trainer-job.yaml").read_text()
    assert validate.kubernetes(job) == ["Job/grpo-trainer"]
    assert "s3://training-data/fleet-1/" in job
