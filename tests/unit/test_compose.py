"""docker-compose.yml, loaded by the Compose specification's own loader (compose-go,
as ``docker compose`` does: interpolation from .env, schema validation,
normalization). There is no Docker engine here: what the engine does with the
volumes is simulated in tests/integration/test_compose_volumes.py."""

from __future__ import annotations

import configparser
import functools
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from stream_export import settings
from stream_export.settings import values
from tests.support import validate

ROOT = Path(__file__).resolve().parents[2]
#: Services that keep running; each restarts after a crash or a host reboot.
LONG_RUNNING = ("kafka", "worker", "demo", "gateway", "prometheus", "grafana")


def _versions() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in (ROOT / ".env").read_text().splitlines() if line)
    return {k: v for k, v in pairs}


@functools.cache
def _project() -> dict[str, Any]:
    return validate.compose(ROOT / "docker-compose.yml")


def _services() -> dict[str, Any]:
    services: dict[str, Any] = _project()["services"]
    return services


def test_env_file_is_the_dev_versions_file() -> None:
    assert (ROOT / ".env").resolve() == (ROOT / "dev" / "versions.env").resolve()


def test_the_loader_rejects_what_compose_would(tmp_path: Path) -> None:
    broken = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    broken["services"]["worker"]["volume"] = broken["services"]["worker"].pop("volumes")
    (tmp_path / "docker-compose.yml").write_text(yaml.safe_dump(broken))
    (tmp_path / ".env").write_text((ROOT / ".env").read_text())
    done = validate.run("compose", str(tmp_path / "docker-compose.yml"))
    assert done.returncode != 0 and "services.worker.volume" in done.stderr, done.stderr


def test_every_image_is_pinned() -> None:
    for name, service in _services().items():
        image = service["image"]
        repo, _, tag = image.rpartition(":")
        assert repo and tag and tag != "latest", f"{name}: image {image!r} is not pinned"


def test_kafka_image_matches_the_local_broker_version() -> None:
    assert _services()["kafka"]["image"] == f"apache/kafka:{_versions()['KAFKA_VERSION']}"


def test_long_running_services_restart() -> None:
    services = _services()
    assert set(LONG_RUNNING) == set(services)
    for name in LONG_RUNNING:
        assert services[name].get("restart") == "unless-stopped", name


def test_long_running_services_have_healthchecks_and_dependencies_wait_on_them() -> None:
    services = _services()
    for name in ("kafka", "worker", "gateway", "prometheus", "grafana"):
        assert services[name]["healthcheck"]["test"], name
    for name, service in services.items():
        for dep, cond in (service.get("depends_on") or {}).items():
            assert dep in services, f"{name} depends on unknown {dep}"
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits on {dep} health"
    assert services["grafana"]["depends_on"]["prometheus"]["condition"] == "service_healthy"


def test_prometheus_starts_whatever_the_worker_does() -> None:
    # It is what reports a worker that is down, so it never waits on the worker.
    assert "worker" not in (_services()["prometheus"].get("depends_on") or {})


def test_environment_names_are_settings_the_worker_reads() -> None:
    known = set(settings.env_names())
    for name, service in _services().items():
        for var in service.get("environment") or {}:
            if var.startswith(values.ENV_PREFIX):
                assert var in known, f"{name}: {var} is not a setting"


def _mounts(service: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["target"]: m for m in service.get("volumes") or []}


def test_state_is_in_named_volumes_and_bind_mounts_are_read_only_config() -> None:
    """A bind mount's missing host folder is created root-owned, which the worker
    (uid 10001) cannot write; a new named volume takes the image folder's owner."""
    project = _project()
    for name, service in _services().items():
        for target, mount in _mounts(service).items():
            if mount["type"] == "bind":
                assert mount.get("read_only") is True, f"{name}: {target} is a writable bind mount"
                assert (ROOT / mount["source"]).exists(), f"{name}: {mount['source']} is missing"
            else:
                assert mount["type"] == "volume", (name, target)
                volume = project["volumes"][mount["source"]]
                assert not volume.get("driver_opts"), f"{name}: {target} is a bind in disguise"
                assert not volume.get("external"), f"{name}: {target} needs a manual step"


def test_the_worker_writes_its_output_and_state_to_volumes() -> None:
    worker = _services()["worker"]
    mounts = _mounts(worker)
    env = worker["environment"]
    for setting in ("STREAM_EXPORT_SINK_OUTPUT_DIR", "STREAM_EXPORT_WORKER_DATA_DIR"):
        assert mounts[env[setting]]["type"] == "volume", setting


def test_the_gateway_keeps_its_episodes_in_a_volume_and_hands_out_the_published_port() -> None:
    gateway = _services()["gateway"]
    env = gateway["environment"]
    assert _mounts(gateway)[env["STREAM_EXPORT_GATEWAY_STATE_DIR"]]["type"] == "volume"
    port = settings.load(env={}).gateway.port  # the default the gateway listens on
    assert {(p["target"], p["published"]) for p in gateway["ports"]} == {(port, str(port))}
    assert env["STREAM_EXPORT_GATEWAY_PUBLIC_URL"] == f"http://localhost:{port}"
    assert env["STREAM_EXPORT_GATEWAY_HOST"] == "0.0.0.0"
    assert gateway["depends_on"]["worker"]["condition"] == "service_healthy"  # topics exist
    assert f"127.0.0.1:{port}/healthz" in " ".join(gateway["healthcheck"]["test"])


def test_kafka_keeps_its_log_in_a_volume_beside_the_worker_state() -> None:
    kafka = _services()["kafka"]
    log_dir = kafka["environment"]["KAFKA_LOG_DIRS"]
    assert _mounts(kafka)[log_dir]["type"] == "volume"
    # A fixed cluster id, valid for `kafka-storage.sh format` (16 bytes, base64).
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}", kafka["environment"]["CLUSTER_ID"])


def test_the_docs_say_how_to_reach_the_files() -> None:
    output = _services()["worker"]["environment"]["STREAM_EXPORT_SINK_OUTPUT_DIR"]
    readme = (ROOT / "docs" / "operations" / "docker-compose.md").read_text()
    assert f"docker compose cp worker:{output} ./training-data" in readme
    assert "docker compose down -v" in readme


def test_prometheus_loads_the_rules_and_scrapes_the_worker() -> None:
    services = _services()
    mounts = _mounts(services["prometheus"])
    prom = yaml.safe_load((ROOT / mounts["/etc/prometheus/prometheus.yml"]["source"]).read_text())
    for rule_file in prom["rule_files"]:
        assert str(Path("/etc/prometheus") / rule_file) in mounts, rule_file
    jobs = {job["job_name"]: job for job in prom["scrape_configs"]}
    # the rules and the dashboard select these jobs: the worker's and the gateway's
    for name, service in (("stream-export", "worker"), ("stream-export-gateway", "gateway")):
        (target,) = jobs.pop(name)["static_configs"][0]["targets"]
        host, port = target.split(":")
        published = {(p["target"], p["published"]) for p in services[service]["ports"]}
        assert host == service and (int(port), port) in published
    assert not jobs


def test_grafana_gets_the_data_source_and_the_dashboard() -> None:
    mounts = _mounts(_services()["grafana"])
    provisioning = ROOT / mounts["/etc/grafana/provisioning"]["source"]
    (datasource,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())[
        "datasources"
    ]
    assert datasource["type"] == "prometheus" and datasource["url"] == "http://prometheus:9090"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "stream-export.yml").read_text())[
        "providers"
    ]
    dashboards = ROOT / mounts[provider["options"]["path"]]["source"]
    assert (dashboards / "stream-export.json").exists()


@pytest.mark.parametrize("target", ["/data", "/state"])
def test_the_image_creates_the_volume_folders_owned_by_its_user(target: str) -> None:
    """What Docker copies into a new named volume: the image's folder, owner included."""
    text = re.sub(r"\s*\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    (uid,) = re.findall(r"^USER (\d+)$", text, re.M)
    (user,) = re.findall(rf"useradd .*--uid {uid} (\w+)", text)
    (made,) = re.findall(r"mkdir -p ((?:/\S+ ?)+) && chown (\w+):(\w+) ((?:/\S+ ?)+)", text)
    assert target in made[0].split() and target in made[3].split()
    assert made[1:3] == (user, user)
    assert target in _mounts(_services()["worker"])


def test_every_port_is_published_on_the_loopback_address_only() -> None:
    """The gateway has no client keys here, the status page and Prometheus answer
    anyone: nothing is reachable from another host."""
    published = [(name, p) for name, s in _services().items() for p in s.get("ports", [])]
    assert {name for name, _ in published} == {"worker", "gateway", "prometheus", "grafana"}
    for name, port in published:
        assert port.get("host_ip") == "127.0.0.1", (name, port)


def test_grafana_has_no_admin_password_unless_one_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grafana = _services()["grafana"]
    env = grafana["environment"]
    assert env["GF_SECURITY_ADMIN_PASSWORD"] in ("", None) and "admin" not in env.values()
    ini = ROOT / _mounts(grafana)["/etc/grafana/grafana.ini"]["source"]
    parsed = configparser.ConfigParser()
    parsed.read_string(ini.read_text())
    assert parsed["security"].getboolean("disable_initial_admin_creation")
    assert parsed["auth"].getboolean("disable_login_form")
    assert not parsed["auth.basic"].getboolean("enabled")
    # Grafana ignores an empty variable: the file's values hold, no admin, no login
    off = ("GF_SECURITY_DISABLE_INITIAL_ADMIN_CREATION", "GF_AUTH_DISABLE_LOGIN_FORM")
    assert all(env.get(name) in ("", None) for name in off)
    monkeypatch.setenv("GRAFANA_ADMIN_PASSWORD", "correct-horse")
    given = validate.compose(ROOT / "docker-compose.yml")["services"]["grafana"]["environment"]
    assert given["GF_SECURITY_ADMIN_PASSWORD"] == "correct-horse"
    assert [given[name] for name in off] == ["false", "false"]
    assert given["GF_AUTH_BASIC_ENABLED"] == "true"
