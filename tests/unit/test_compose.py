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
