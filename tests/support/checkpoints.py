"""New checkpoints of the tiny test model, written with the standard library only
(safetensors' layout, float32 tensors): the same tensors with other values (a
real weight update), one tensor's shape changed in the header (a checkpoint
vLLM must never be asked to load), or a file longer than its tensors (a header
that passes the check, a file vLLM fails to load). ``config.json`` comes along, so transformers
can load the folder as the reference for vLLM's logprobs."""

from __future__ import annotations

import json
import random
import shutil
import struct
from array import array
from pathlib import Path


def _read(source: Path) -> tuple[dict[str, dict[str, object]], bytes]:
    raw = (source / "model.safetensors").read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + size]), raw[8 + size :]


def _write(target: Path, source: Path, head: dict[str, dict[str, object]], data: bytes) -> Path:
    target.mkdir(parents=True)
    shutil.copy(source / "config.json", target / "config.json")
    encoded = json.dumps(head).encode()
    encoded += b" " * (-len(encoded) % 8)
    (target / "model.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    return target


def perturbed(
    source: Path, target: Path, seed: int, scale: float = 0.05, trailing: int = 0
) -> Path:
    """``source``'s model with Gaussian noise (``scale``) added to every weight;
    ``trailing`` zero bytes after the tensors (as when a checkpoint is written over
    a longer file without truncating it: safetensors refuses such a file)."""
    head, data = _read(source)
    values = array("f")
    values.frombytes(data)
    noise = random.Random(seed)
    for i in range(len(values)):
        values[i] += noise.gauss(0.0, scale)
    for name, info in head.items():
        if name != "__metadata__":
            assert info["dtype"] == "F32", (name, info)
    return _write(target, source, head, values.tobytes() + bytes(trailing))


def reshaped(source: Path, target: Path) -> Path:
    """``source``'s model with the first tensor's shape transposed in the header
    (its bytes unchanged: only a header check can tell)."""
    head, data = _read(source)
    shapes: dict[str, list[int]] = {n: list(h["shape"]) for n, h in head.items() if "shape" in h}  # type: ignore[call-overload]
    name = next(n for n in sorted(shapes) if len(shapes[n]) == 2)
    head[name]["shape"] = shapes[name][::-1]
    return _write(target, source, head, data)
