"""The chart's gateway option (gateway.enabled): a StatefulSet whose pods keep their
episodes' write-ahead log on a volume of their own, a Service for the session API,
and a headless Service whose per-pod names are the base URLs the pods hand out, so
every call of an episode reaches the pod that holds it (sticky by construction).
Rendered with helm template and decoded strictly, like the rest of the chart."""

from __future__ import annotations

import re
from typing import Any

from stream_export import settings
from stream_export.gateway.access import Access
from stream_export.settings import values
from tests.support import validate
from tests.support.helm_chart import env, render, rendered, statefulset, template, worker
from tests.support.monitoring import CHART

GATEWAY_VALUES = CHART / "ci" / "gateway-values.yaml"


def settings_of(container: dict[str, Any], pod_name: str) -> settings.Settings:
    """The settings the container's environment loads, $(POD_NAME) expanded as the
    kubelet does."""
    found = {
        name: value.replace("$(POD_NAME)", pod_name)
        for name, value in env(container).items()
        if name.startswith(values.ENV_PREFIX) and value is not None
    }
    return settings.load(env=found)


def test_the_gateway_is_off_by_default() -> None:
    m = render(None)
    assert [s["metadata"]["name"] for s in m["StatefulSet"]] == ["rel-stream-export"]
    assert not [s for s in m["Service"] if "gateway" in s["metadata"]["name"]]


def test_each_gateway_pod_hands_out_its_own_address_on_the_headless_service() -> None:
    m = render(GATEWAY_VALUES)
    sts = statefulset(m, "gateway")
    _, container = worker(m, "gateway")
    services = {s["metadata"]["name"]: s for s in m["Service"]}
    headless = services[sts["spec"]["serviceName"]]
    assert headless["spec"]["clusterIP"] == "None"
    assert sts["spec"]["replicas"] == 2
    names = [e["name"] for e in container["env"]]
    # the kubelet expands $(POD_NAME) only when it is defined earlier in the list
    assert names.index("POD_NAME") < names.index("STREAM_EXPORT_GATEWAY_PUBLIC_URL")
    (pod_name,) = [e for e in container["env"] if e["name"] == "POD_NAME"]
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    s = settings_of(container, "rel-stream-export-gateway-1")
    port = container["ports"][0]["containerPort"]
    assert s.gateway.public_url == (
        f"http://rel-stream-export-gateway-1.{headless['metadata']['name']}.ns.svc:{port}"
    )
    assert (s.gateway.host, s.gateway.port, s.gateway.state_dir) == ("0.0.0.0", port, "/state")
    assert s.gateway.upstreams == ["http://vllm-0.vllm:8000/v1", "http://vllm-1.vllm:8000/v1"]
    assert (s.gateway.on_kafka_down, s.gateway.ack_timeout_s) == ("answer", 5.0)  # settings
    assert s.kafka.bootstrap_servers == "kafka:9092" and s.topics.steps == "agent-steps"


def test_a_public_url_replaces_the_pod_addresses() -> None:
    _, container = worker(
        render(GATEWAY_VALUES, "gateway.publicUrl=https://gw.example.com"), "gateway"
    )
    assert settings_of(container, "any").gateway.public_url == "https://gw.example.com"


def test_the_write_ahead_log_is_on_a_volume_per_pod() -> None:
    m = render(GATEWAY_VALUES)
    sts = statefulset(m, "gateway")
    _, container = worker(m, "gateway")
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "state"
    assert claim["spec"]["resources"]["requests"]["storage"] == "2Gi"
    assert claim["spec"]["storageClassName"] == "fast-ssd"
    mounts = {v["name"]: v["mountPath"] for v in container["volumeMounts"]}
    assert mounts["state"] == env(container)["STREAM_EXPORT_GATEWAY_STATE_DIR"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}


def test_gateway_and_worker_selectors_never_pick_each_others_pods() -> None:
    m = render(GATEWAY_VALUES)
    labels = {
        component: statefulset(m, component)["spec"]["template"]["metadata"]["labels"]
        for component in ("worker", "gateway")
    }
    selectors = [(s["metadata"]["name"], s["spec"]["selector"]) for s in m["Service"]]
    selectors += [
        (p["metadata"]["name"], p["spec"]["podSelector"]["matchLabels"])
        for p in m.get("NetworkPolicy", [])
    ]
    selectors += [
        (p["metadata"]["name"], p["spec"]["selector"]["matchLabels"])
        for p in m["PodDisruptionBudget"]
    ]
    for name, selector in selectors:
        picks = [c for c, pod in labels.items() if selector.items() <= pod.items()]
        assert picks == (["gateway"] if "gateway" in name else ["worker"]), name


def test_client_keys_and_the_upstream_key_come_from_secrets_never_values() -> None:
    m = render(GATEWAY_VALUES)
    pod, container = worker(m, "gateway")
    mounts = {v["name"]: v for v in container["volumeMounts"]}
    keys_file = env(container)["STREAM_EXPORT_GATEWAY_API_KEYS_FILE"]
    assert keys_file == f"{mounts['gateway-keys']['mountPath']}/api-keys"
    assert mounts["gateway-keys"]["readOnly"] is True
    (volume,) = [v for v in pod["volumes"] if v["name"] == "gateway-keys"]
    assert volume["secret"]["secretName"] == "gateway-client-keys"
    (upstream,) = [
        e for e in container["env"] if e["name"] == "STREAM_EXPORT_GATEWAY_UPSTREAM_API_KEY"
    ]
    assert upstream == {
        "name": "STREAM_EXPORT_GATEWAY_UPSTREAM_API_KEY",
        "valueFrom": {"secretKeyRef": {"name": "vllm-api-key", "key": "token"}},
    }
    _, plain = worker(render(GATEWAY_VALUES, "gateway.upstreamApiKey.existingSecret="), "gateway")
    assert "STREAM_EXPORT_GATEWAY_UPSTREAM_API_KEY" not in env(plain)


def test_the_gateway_service_monitor_scrapes_each_gateway_pod_once() -> None:
    m = render(GATEWAY_VALUES)
    monitors = {s["metadata"]["name"]: s for s in m["ServiceMonitor"]}
    monitor = monitors["rel-stream-export-gateway"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    selected = [s for s in m["Service"] if selector.items() <= s["metadata"]["labels"].items()]
    assert [s["metadata"]["name"] for s in selected] == ["rel-stream-export-gateway"]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["relabelings"][0]["replacement"] == "stream-export-gateway"
    assert "clusterIP" not in selected[0]["spec"]


def test_the_gateway_manifests_decode_strictly() -> None:
    checked = validate.kubernetes(rendered(GATEWAY_VALUES))
    assert "StatefulSet/rel-stream-export-gateway" in checked
    assert "Service/rel-stream-export-gateway-headless" in checked


def test_settings_the_gateway_template_sets_are_refused_under_settings() -> None:
    for bad, named in (
        ("settings.gateway.state_dir=/x", "'state_dir' not allowed"),
        ("settings.gateway.upstreams=http://x", "'upstreams' not allowed"),
        ("settings.gateway.upstream_api_key=k", "'upstream_api_key' not allowed"),
        ("gateway.upstreams[0]=vllm:8000", "/gateway/upstreams/0"),
        ("gateway.port=0", "/gateway/port"),
    ):
        done = template("--set", bad)
        assert done.returncode != 0 and "schema" in done.stderr, done.stderr
        assert named in done.stderr, done.stderr


def test_the_docs_gateway_install_command_renders() -> None:
    section = (CHART.parents[1] / "docs" / "gateway.md").read_text()
    command = section.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    (install,) = [line for line in command.splitlines() if "helm install" in line]
    sets = [s.strip("'") for s in re.findall(r"--set ('[^']+'|\S+)", install)]
    m = render(None, *sets)
    assert statefulset(m, "gateway")["spec"]["replicas"] == 2
    _, container = worker(m, "gateway")
    assert settings_of(container, "p").gateway.upstreams == [
        "http://vllm-0.vllm:8000/v1",
        "http://vllm-1.vllm:8000/v1",
    ]


def test_the_gateway_needs_client_keys_and_only_the_namespace_reaches_it() -> None:
    """Closed by default: no keys fails the render with the fix; with keys (or the
    explicit allowWithoutKeys) a NetworkPolicy selects the gateway's pods and admits
    only the namespace's pods and the configured peers to its port."""
    done = template("--set", "gateway.enabled=true")
    assert done.returncode != 0
    assert "gateway.apiKeys.existingSecret" in done.stderr
    assert "gateway.allowWithoutKeys=true" in done.stderr
    for sets in (("gateway.apiKeys.existingSecret=k",), ("gateway.allowWithoutKeys=true",)):
        m = render(None, "gateway.enabled=true", *sets)
        pods = statefulset(m, "gateway")["spec"]["template"]["metadata"]["labels"]
        [policy] = [p for p in m["NetworkPolicy"] if p["metadata"]["name"].endswith("-gateway")]
        spec = policy["spec"]
        assert spec["podSelector"]["matchLabels"].items() <= pods.items()
        assert spec["policyTypes"] == ["Ingress"]
        (rule,) = spec["ingress"]
        assert rule == {
            "ports": [{"port": "http", "protocol": "TCP"}],
            "from": [{"podSelector": {}}],
        }
    peer = {"namespaceSelector": {"matchLabels": {"team": "agents"}}}
    m = render(
        GATEWAY_VALUES,
        "gateway.networkPolicy.extraIngressFrom[0].namespaceSelector.matchLabels.team=agents",
    )
    [policy] = [p for p in m["NetworkPolicy"] if p["metadata"]["name"].endswith("-gateway")]
    assert policy["spec"]["ingress"][0]["from"] == [{"podSelector": {}}, peer]
    assert "NetworkPolicy" not in render(GATEWAY_VALUES, "networkPolicy.enabled=false")


def test_a_gateway_without_keys_is_told_so_and_answers_its_service_names() -> None:
    """The gateway refuses to listen on 0.0.0.0 without keys unless
    gateway.allow_without_keys: the chart sets it with allowWithoutKeys, and the
    Service's names as gateway.allowed_hosts (a keyless gateway answers only names
    it knows); with keys neither is set."""
    m = render(None, "gateway.enabled=true", "gateway.allowWithoutKeys=true")
    s = settings_of(worker(m, "gateway")[1], "rel-stream-export-gateway-0")
    checked = Access(s.gateway)  # starts: no StartupError
    for host in ("rel-stream-export-gateway:9180", "rel-stream-export-gateway.ns.svc"):
        assert checked.host_allowed(host), host
    assert not checked.host_allowed("evil.example")
    m = render(None, "gateway.enabled=true", "gateway.apiKeys.existingSecret=k")
    s = settings_of(worker(m, "gateway")[1], "rel-stream-export-gateway-0")
    assert (s.gateway.allow_without_keys, s.gateway.allowed_hosts) == (False, [])
