"""dev/validate, the Go helper dev/setup builds: the Compose specification's own
loader and strict decoding into the Kubernetes API types, both offline."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "dev" / "validate"


def binary() -> Path:
    """The build of the current sources (dev/setup names its folder by their hash)."""
    files = [SOURCE / "go.mod", SOURCE / "go.sum", *sorted(SOURCE.glob("*.go"))]
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]
    path = ROOT / "dev" / ".cache" / f"validate-{digest}" / "validate"
    assert path.exists(), f"{path} is missing: run dev/setup --dev"
    return path


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
