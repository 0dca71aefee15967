"""dev/validate, the Go helper dev/setup builds: the Compose specification's own
loader and strict decoding into the Kubernetes API types, both offline."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from tests.support import go_programs

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "dev" / "validate"


def binary() -> Path:
    return go_programs.built(SOURCE, "validate")


def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary()), *args], input=stdin, capture_output=True, text=True, timeout=60
    )


def compose(file: Path) -> dict[str, Any]:
    """The project as ``docker compose`` loads it: interpolated, validated, normalized."""
    done = run("compose", str(file))
    assert done.returncode == 0, done.stderr
    project: dict[str, Any] = json.loads(done.stdout)
    return project


def kubernetes(manifests: str) -> list[str]:
    """Decode every manifest strictly into its API type; kind/name of each."""
    done = run("k8s", stdin=manifests)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()
