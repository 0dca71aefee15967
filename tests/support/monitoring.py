"""Helpers for the operations tests: the deploy/ files, PromQL names, HTTP, tools,
headless Chromium."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "rules.test.yml"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus" / "prometheus.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "stream-export.json"
CHART = ROOT / "helm" / "stream-export"

#: Sample names a metric family of each type exposes, from its family name.
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}
_NAME = re.compile(r"\b(?:stream_export|process)_[a-zA-Z0-9_]+")


def versions() -> dict[str, str]:
    lines = (ROOT / "dev" / "versions.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def tool(name: str) -> str:
    """Path of a tool dev/setup installs; fail (never skip) when it is missing."""
    if name == "helm":
        path = ROOT / "dev" / ".cache" / f"helm-{versions()['HELM_VERSION']}" / "bin" / "helm"
        found = str(path) if path.exists() else None
    else:
        found = shutil.which(name)
    assert found, f"{name} is missing: run dev/setup"
    return found


def rules() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return data


def dashboard() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return data


def promql_expressions() -> list[str]:
    """Every PromQL expression in the alert rules and the dashboard (panels and variables)."""
    exprs = [r["expr"] for g in rules()["groups"] for r in g["rules"]]
    d = dashboard()
    exprs += [t["expr"] for p in d["panels"] for t in p.get("targets", [])]
    exprs += [v["definition"] for v in d["templating"]["list"] if "definition" in v]
    return exprs


#: The gateway's metrics: its own process and registry (stream-export gateway).
GATEWAY_PREFIX = "stream_export_gateway_"


def referenced_names(gateway: bool = False) -> set[str]:
    """The stream_export_* and process_* sample names the rules and the dashboard query:
    the worker's, or (``gateway``) the gateway's, each exposed by its own process."""
    names = {name for expr in promql_expressions() for name in _NAME.findall(expr)}
    return {name for name in names if name.startswith(GATEWAY_PREFIX) == gateway}


def exposed_names(exposition: str) -> set[str]:
    """Sample names a /metrics text declares (families without samples yet included)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(exposition):
        names.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
        names.update(s.name for s in family.samples)
    return names


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """(status, body) of a GET; (0, b"") when nothing answers yet."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return 0, b""


def labelled(port: int, name: str, label: str, value: str) -> float:
    """The sample ``name{label="value"}`` of the worker's /metrics on ``port`` (0 when
    it has none)."""
    status, body = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200
    prefix = f'{name}{{{label}="{value}"}} '
    found = [line for line in body.decode().splitlines() if line.startswith(prefix)]
    return float(found[0].removeprefix(prefix)) if found else 0.0


def get_json(url: str) -> Any:
    status, body = get(url)
    return json.loads(body) if status == 200 else None


def dom_text(dom: str, element_id: str) -> str:
    match = re.search(rf'id="{element_id}"[^>]*>([^<]*)<', dom)
    assert match, f"#{element_id} missing from the page"
    return match.group(1)


def chromium(*args: str, profile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            tool("chromium"),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={profile}",
            "--window-size=1280,900",
            "--virtual-time-budget=5000",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=90,
    )
