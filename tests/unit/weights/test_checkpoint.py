"""A checkpoint's safetensors headers, checked before a server is asked to load it:
the names, dtypes and shapes must be the served model's; a file that is no
safetensors file, whatever its bytes, is a WeightLoadError, never a crash."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_export.errors import WeightLoadError
from stream_export.weights import checkpoint


def write(folder: Path, tensors: dict[str, tuple[str, list[int]]], data: bytes = b"") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    head: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        size = 4
        for d in shape:
            size *= d
        head[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    encoded = json.dumps(head).encode()
    body = data or bytes(offset)
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(encoded)) + encoded + body)
    return folder


SERVED = {"embed.weight": ("F32", [8, 4]), "lm_head.weight": ("F32", [4, 8])}


def test_the_same_names_dtypes_and_shapes_pass(tmp_path: Path) -> None:
    checkpoint.check(write(tmp_path / "new", SERVED), write(tmp_path / "served", SERVED))


@pytest.mark.parametrize(
    ("tensors", "said"),
    [
        ({"embed.weight": ("F32", [8, 4])}, "missing lm_head.weight"),
        ({**SERVED, "extra": ("F32", [1])}, "unknown extra"),
        (
            {**SERVED, "lm_head.weight": ("F32", [8, 4])},
            "lm_head.weight: F32[8, 4], serving F32[4, 8]",
        ),
        ({**SERVED, "lm_head.weight": ("BF16", [4, 8])}, "lm_head.weight: BF16[4, 8]"),
    ],
)
def test_a_checkpoint_that_differs_is_refused_naming_how(
    tmp_path: Path, tensors: dict[str, tuple[str, list[int]]], said: str
) -> None:
    with pytest.raises(WeightLoadError) as refused:
        checkpoint.check(write(tmp_path / "new", tensors), write(tmp_path / "served", SERVED))
    assert refused.value.reason == "checkpoint_mismatch"
    assert said in refused.value.detail


def test_offsets_past_the_files_end_and_an_empty_folder_are_refused(tmp_path: Path) -> None:
    short = write(tmp_path / "short", SERVED, data=b"\0" * 10)
    with pytest.raises(WeightLoadError, match="outside the file"):
        checkpoint.layout(short)
    (tmp_path / "empty").mkdir()
    with pytest.raises(WeightLoadError, match=r"no \*\.safetensors"):
        checkpoint.layout(tmp_path / "empty")


@given(st.binary(max_size=300))
def test_any_bytes_are_a_layout_or_a_weight_load_error(
    tmp_path_factory: pytest.TempPathFactory, raw: bytes
) -> None:
    path = tmp_path_factory.mktemp("fuzz") / "model.safetensors"
    path.write_bytes(raw)
    try:
        checkpoint.header(path)
    except WeightLoadError as exc:
        assert exc.reason == "checkpoint_mismatch"


@given(
    st.recursive(
        st.none() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
        max_leaves=10,
    )
)
def test_any_json_header_is_a_layout_or_a_weight_load_error(
    tmp_path_factory: pytest.TempPathFactory, head: object
) -> None:
    encoded = json.dumps(head).encode()
    path = tmp_path_factory.mktemp("fuzz") / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded)
    try:
        checkpoint.header(path)
    except WeightLoadError as exc:
        assert exc.reason == "checkpoint_mismatch"
