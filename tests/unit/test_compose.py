"""docker-compose.yml cannot run here (no Docker engine), so check its consistency."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from stream_export import config

ROOT = Path(__file__).resolve().parents[2]


def _versions() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (ROOT / ".env").read_text().splitlines() if line)
    return {k: v for k, v in pairs}


def _compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return data


def _image(service: dict[str, Any]) -> str:
    versions = _versions()
    return re.sub(r"\$\{(\w+)(:\?[^}]*)?\}", lambda m: versions[m.group(1)], str(service["image"]))


def test_env_file_is_the_dev_versions_file() -> None:
    assert (ROOT / ".env").resolve() == (ROOT / "dev" / "versions.env").resolve()


def test_every_image_is_pinned() -> None:
    for name, service in _compose()["services"].items():
        image = _image(service)
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{name}: image {image!r} is not pinned"


def test_kafka_image_matches_the_local_broker_version() -> None:
    kafka = _compose()["services"]["kafka"]
    assert _image(kafka) == f"apache/kafka:{_versions()['KAFKA_VERSION']}"


def test_long_running_services_have_healthchecks_and_dependencies_wait_on_them() -> None:
    services = _compose()["services"]
    for name in ("kafka", "worker", "prometheus"):
        assert "test" in services[name]["healthcheck"], name
    for name, service in services.items():
        for dep, cond in (service.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits on {dep} health"


def test_environment_names_are_settings_the_worker_reads() -> None:
    known = set(config.env_names())
    for name, service in _compose()["services"].items():
        for var in service.get("environment") or {}:
            if var.startswith(config.ENV_PREFIX):
                assert var in known, f"{name}: {var} is not a setting"


def test_the_full_stack_is_there() -> None:
    services = _compose()["services"]
    assert {"kafka", "worker", "demo", "prometheus", "grafana"} <= set(services)
    assert "test" in services["grafana"]["healthcheck"]
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"


def _mounts(service: dict[str, Any]) -> dict[str, Path]:
    """Container path -> repository path of the service's bind mounts."""
    out = {}
    for volume in service.get("volumes") or []:
        source, target = str(volume).split(":")[:2]
        if source.startswith("./"):
            out[target] = ROOT / source
    return out


def test_bind_mounts_exist_in_the_repository() -> None:
    for name, service in _compose()["services"].items():
        for target, source in _mounts(service).items():
            if name != "worker":  # the worker's output folder is created at run time
                assert source.exists(), f"{name}: {source} mounted at {target} is missing"


def test_prometheus_loads_the_rules_and_scrapes_the_worker() -> None:
    services = _compose()["services"]
    mounts = _mounts(services["prometheus"])
    config_path = mounts["/etc/prometheus/prometheus.yml"]
    prom = yaml.safe_load(config_path.read_text())
    for rule_file in prom["rule_files"]:
        assert (Path("/etc/prometheus") / rule_file) in {Path(t) for t in mounts}, rule_file
    (job,) = prom["scrape_configs"]
    assert job["job_name"] == "stream-export"  # the rules and the dashboard select this job
    (target,) = job["static_configs"][0]["targets"]
    host, port = target.split(":")
    assert host == "worker" and f"{port}:{port}" in services["worker"]["ports"]


def test_grafana_gets_the_data_source_and_the_dashboard() -> None:
    mounts = _mounts(_compose()["services"]["grafana"])
    provisioning = mounts["/etc/grafana/provisioning"]
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "stream-export.yml").read_text())[
        "providers"
    ]
    dashboards = mounts[provider["options"]["path"]]
    assert (dashboards / "stream-export.json").exists()
