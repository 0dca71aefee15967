"""The repository's Go programs (dev/validate, the send-events example) as dev/setup
builds them: into dev/.cache/NAME-<hash of go.mod, go.sum and the .go files>/NAME."""

from __future__ import annotations

import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def built(source: Path, name: str) -> Path:
    """The build of ``source``'s current files (an edit means a new folder)."""
    files = [source / "go.mod", source / "go.sum", *sorted(source.glob("*.go"))]
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()[:16]
    path = ROOT / "dev" / ".cache" / f"{name}-{digest}" / name
    assert path.exists(), f"{path} is missing: run dev/setup --dev"
    return path
