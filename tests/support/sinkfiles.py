"""Helpers for writer/follow tests: settings, reading back everything a writer left."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import msgspec

from stream_export.output.layout import open_sealed, read_checkpoint, read_manifest
from stream_export.settings.sink import SinkSettings


def sink_settings(out: Path, **fields: Any) -> SinkSettings:
    return msgspec.convert({"output_dir": str(out), **fields}, SinkSettings)


def record(i: int) -> bytes:
    return msgspec.json.encode({"prompt": f"p{i}", "completion": "x" * (i % 50)})


def all_lines(out: Path, prefix: str = "training-data") -> list[bytes]:
    """Sealed files in manifest order, then the active files, checked against the manifest."""
    got: list[bytes] = []
    for entry in read_manifest(out, prefix):
        path = out / entry.name
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256
        assert path.stat().st_size == entry.bytes
        with open_sealed(path) as fh:
            data = fh.read()
        assert data.endswith(b"\n")
        lines = data.split(b"\n")[:-1]
        assert len(lines) == entry.records
        got += lines
    ckpt = read_checkpoint(out, prefix)
    assert ckpt is not None and not ckpt.pending
    for state in ckpt.active.values():
        path = out / state.path
        data = path.read_bytes() if path.exists() else b""
        assert len(data) == state.length
        got += data.split(b"\n")[:-1]
    return got
