"""What a safetensors checkpoint holds, read from its headers alone (pure: no
tensor is loaded): each tensor's name, dtype and shape, checked against the
model a server serves before new weights go near it.

A safetensors file is an 8-byte little-endian header length, a JSON header
(``{name: {"dtype", "shape", "data_offsets"}, "__metadata__": {...}}``), then
the tensors' bytes. A sharded checkpoint is several such files in one folder.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Final

import msgspec

from stream_export.errors import WeightLoadError

#: A header larger than this is no header (safetensors' own limit is 100 MB).
MAX_HEADER_BYTES: Final = 100_000_000
#: How many differences an error names.
SHOWN: Final = 5


class TensorInfo(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    dtype: str
    shape: list[int]
    data_offsets: tuple[int, int]


Layout = dict[str, tuple[str, tuple[int, ...]]]
_header = msgspec.json.Decoder(dict[str, msgspec.Raw])
_tensor = msgspec.json.Decoder(TensorInfo)


def header(path: Path) -> Layout:
    """name -> (dtype, shape) of one safetensors file; WeightLoadError
    checkpoint_mismatch when it is not one (short, a bad header, offsets past
    its end)."""
    try:
        with path.open("rb") as file:
            head = file.read(8)
            if len(head) != 8:
                raise ValueError("shorter than its header's length")
            (size,) = struct.unpack("<Q", head)
            if size > MAX_HEADER_BYTES:
                raise ValueError(f"a header of {size} bytes")
            raw = file.read(size)
            if len(raw) != size:
                raise ValueError("shorter than its header")
            data_bytes = path.stat().st_size - 8 - size
        layout: Layout = {}
        for name, value in _header.decode(raw).items():
            if name == "__metadata__":
                continue
            tensor = _tensor.decode(value)
            start, end = tensor.data_offsets
            if not 0 <= start <= end <= data_bytes or any(d < 0 for d in tensor.shape):
                raise ValueError(f"tensor {name!r} lies outside the file")
            layout[name] = (tensor.dtype, tuple(tensor.shape))
    except (OSError, ValueError, struct.error) as exc:
        raise WeightLoadError(
            f"{path} is not a safetensors file: {exc}", reason="checkpoint_mismatch"
        ) from None
    return layout


def layout(directory: Path) -> Layout:
    """The tensors of every ``*.safetensors`` file in ``directory`` (a name twice
    is refused)."""
    files = sorted(Path(directory).glob("*.safetensors"))
    if not files:
        raise WeightLoadError(f"no *.safetensors file in {directory}", reason="checkpoint_mismatch")
    found: Layout = {}
    for path in files:
        for name, info in header(path).items():
            if name in found:
                raise WeightLoadError(
                    f"tensor {name!r} is in two files of {directory}", reason="checkpoint_mismatch"
                )
            found[name] = info
    return found


def differences(new: Layout, serving: Layout) -> list[str]:
    """How ``new`` differs from the ``serving`` model's tensors (names, dtypes,
    shapes); empty when it can replace them."""
    found = [f"missing {name}" for name in sorted(serving.keys() - new.keys())]
    found += [f"unknown {name}" for name in sorted(new.keys() - serving.keys())]
    for name in sorted(new.keys() & serving.keys()):
        if new[name] != serving[name]:
            (dtype, shape), (want_dtype, want_shape) = new[name], serving[name]
            found.append(f"{name}: {dtype}{list(shape)}, serving {want_dtype}{list(want_shape)}")
    return found


def check(directory: Path, serving: Path) -> None:
    """WeightLoadError checkpoint_mismatch unless ``directory`` holds exactly the
    tensors (names, dtypes, shapes) of the checkpoint in ``serving``."""
    found = differences(layout(directory), layout(serving))
    if found:
        more = f" and {len(found) - SHOWN} more" if len(found) > SHOWN else ""
        raise WeightLoadError(
            f"{directory} does not match the served model: {'; '.join(found[:SHOWN])}{more}",
            reason="checkpoint_mismatch",
        )
