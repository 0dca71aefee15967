"""The chart rendered for tests: ``helm`` and ``helm template`` with the ci/ values
files, the manifests by kind, and the worker's container and environment."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support.monitoring import CHART, tool

VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
Manifests = dict[str, list[dict[str, Any]]]
#: helm template's own default (1.20) is below the chart's kubeVersion.
KUBE_VERSION = "1.33.0"


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


def statefulset(manifests: Manifests, component: str = "worker") -> dict[str, Any]:
    """The StatefulSet of the workers or of the gateway."""
    (sts,) = [
        s
        for s in manifests["StatefulSet"]
        if s["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return sts


def worker(
    manifests: Manifests, component: str = "worker"
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pod spec of the workers (or the gateway) and its main container."""
    pod = statefulset(manifests, component)["spec"]["template"]["spec"]
    (container,) = [c for c in pod["containers"] if c["name"] == component]
    return pod, container


def env(container: dict[str, Any]) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container["env"]}
